"""Reading a user's text file: one rule for "exists, is UTF-8, is not empty", one kind of error."""

from __future__ import annotations

from pathlib import Path

from hartonomous.errors import UserError


def read_user_text(path: Path, label: str) -> str:
    """The file's UTF-8 text; a UserError starting with `label` says what is wrong with it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{label} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{label} is not UTF-8 text") from None
    if not text.strip():
        raise UserError(f"{label} is empty")
    return text
