"""The two halves of an atom set's held-out text: calibration and test.

The build tunes what it tunes (bandwidth, centroid window and decay, history weight) on the
calibration half; `compare` scores the test half by default. Calibrating and scoring on the same
text would flatter the spatial path, so the halves never overlap. The holdout is a sequence of
segments joined by a blank line (already shuffled with the build's seed); the split keeps whole
segments: the first ones up to half the characters calibrate, the rest test. A corpus held out by
document (hartonomous.corpus.sources: directories, python-source) records its halves itself: the holdout is
the calibration documents, a blank line, then the test documents, and `recorded_halves` cuts it at
the calibration half's recorded length.
"""

from __future__ import annotations

from dataclasses import dataclass

SEPARATOR = "\n\n"
SPLITS = ("calibration", "test", "all")


@dataclass(frozen=True)
class HoldoutSplits:
    calibration: str
    test: str

    def get(self, name: str, whole: str) -> str:
        """The text of split `name` ('all' is the whole holdout)."""
        if name not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {name!r}")
        return whole if name == "all" else getattr(self, name)


def split_holdout(text: str) -> HoldoutSplits:
    """Whole segments: calibration gets the first ~half of the characters, test the rest.

    A holdout of a single segment is cut at the paragraph (or, failing that, the character)
    nearest its middle, so that both halves are non-empty whenever the text has 2+ characters.
    """
    segments = [s for s in text.split(SEPARATOR) if s.strip()]
    if len(segments) >= 2:
        half, used, cut = len(text) / 2, 0, 1
        for i, seg in enumerate(segments[:-1]):
            used += len(seg) + len(SEPARATOR)
            cut = i + 1
            if used >= half:
                break
        return HoldoutSplits(SEPARATOR.join(segments[:cut]), SEPARATOR.join(segments[cut:]))
    middle = len(text) // 2
    newline = text.rfind("\n", 0, middle)
    cut = newline + 1 if newline > 0 else middle
    return HoldoutSplits(text[:cut], text[cut:])


def recorded_halves(stats) -> HoldoutSplits:
    """The halves of an atom set's recorded holdout (stats: its BuildStats): cut at the calibration
    half's recorded length where the build held out whole documents (stats.corpus.split =
    'documents'), else split_holdout."""
    text = str(stats.holdout.text)
    corpus, calibration = stats.corpus, stats.calibration_split
    if corpus is not None and corpus.split == "documents" and calibration is not None and calibration.chars:
        cut = int(calibration.chars)
        return HoldoutSplits(text[:cut], text[cut + len(SEPARATOR):])
    return split_holdout(text)
