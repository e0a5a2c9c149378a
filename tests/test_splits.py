"""The calibration and test halves of a holdout never overlap and together are the holdout."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hartonomous.splits import SEPARATOR, split_holdout


def test_whole_segments_split_near_the_middle():
    segments = [f"segment {i} " + "x" * 50 for i in range(10)]
    splits = split_holdout(SEPARATOR.join(segments))
    assert splits.calibration == SEPARATOR.join(segments[:5])
    assert splits.test == SEPARATOR.join(segments[5:])


def test_one_long_segment_is_cut_at_a_line_near_its_middle():
    text = "\n".join(f"line {i}" for i in range(20))
    splits = split_holdout(text)
    assert splits.calibration + splits.test == text
    assert splits.calibration.endswith("\n") and splits.test.startswith("line ")


@given(st.lists(st.text(alphabet="ab \n", min_size=1, max_size=30), min_size=1, max_size=12))
def test_halves_are_disjoint_and_cover_the_text(parts):
    text = SEPARATOR.join(parts)
    splits = split_holdout(text)
    joined = [s for s in text.split(SEPARATOR) if s.strip()]
    if len(joined) >= 2:
        assert splits.calibration.split(SEPARATOR) + splits.test.split(SEPARATOR) == joined
    else:
        assert splits.calibration + splits.test == text
