"""The texts a comparison scores: the atom set's recorded holdout, user files, prompt files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hartonomous.atomset import AtomSet
from hartonomous.errors import UserError
from hartonomous.splits import SPLITS, recorded_halves


@dataclass(frozen=True)
class Text:
    """One evaluation text and where it came from."""

    source: str
    text: str
    held_out: bool
    split: str | None = None     # 'test' | 'calibration' | 'all' for the holdout; None for a user file


SPLIT_WORDS = {"test": "test half", "calibration": "calibration half", "all": "both halves"}


def holdout_text(info: AtomSet, split: str = "test") -> Text:
    """One split of the held-out slice recorded by the builder (stats.holdout; hartonomous.splits)."""
    if split not in SPLITS:
        raise UserError(f"--split must be one of test, calibration, all; got {split!r}")
    holdout = info.stats.holdout
    text, source = (holdout.text, holdout.source) if holdout else (None, None)
    if not text or not str(text).strip():
        raise UserError(f"atom set '{info.name}' records no held-out text; pass --text FILE "
                        "(use text that was not used to build the set)")
    part = recorded_halves(info.stats).get(split, str(text))
    if not part.strip():
        raise UserError(f"the {split} half of atom set '{info.name}'s held-out text is empty; "
                        "pass --split all or --text FILE")
    return Text(f"held-out slice of {source or 'the build corpus'}, {SPLIT_WORDS[split]}", part, True, split)


def calibration_text(info: AtomSet) -> Text | None:
    """The calibration half of the holdout, what compare fits its own parameters on (None: no holdout)."""
    try:
        return holdout_text(info, "calibration")
    except UserError:
        return None


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
