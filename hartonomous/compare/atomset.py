"""The texts a comparison scores: the atom set's recorded holdout, user files, prompt files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hartonomous.atomset import AtomSet
from hartonomous.errors import UserError


@dataclass(frozen=True)
class Text:
    """One evaluation text and where it came from."""

    source: str
    text: str
    held_out: bool


def holdout_text(info: AtomSet) -> Text:
    """The held-out slice recorded by the builder (stats.holdout)."""
    holdout = info.stats.holdout
    text, source = (holdout.text, holdout.source) if holdout else (None, None)
    if not text or not str(text).strip():
        raise UserError(f"atom set '{info.name}' records no held-out text; pass --text FILE "
                        "(use text that was not used to build the set)")
    return Text(f"held-out slice of {source or 'the build corpus'}", str(text), True)


def read_texts(paths: list[Path]) -> list[Text]:
    """User-supplied evaluation texts (UTF-8 files)."""
    from hartonomous.textfiles import read_user_text

    texts = []
    for path in paths:
        body = read_user_text(path, f"--text {path}")
        texts.append(Text(str(path), body, False))
    return texts


def read_prompts(path: Path) -> list[str]:
    """One prompt per non-empty line (a literal \\n inside a line becomes a newline)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--prompts {path}: no such file")
    prompts = [line.replace("\\n", "\n") for line in path.read_text(encoding="utf-8").splitlines()
               if line.strip()]
    if not prompts:
        raise UserError(f"--prompts {path}: no prompts (one per line)")
    return prompts
