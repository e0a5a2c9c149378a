"""What a valid next-token distribution is, for the fuzz, load and fault tests.

Valid: ordered by probability descending then token id ascending, probabilities finite and
>= 0 summing to 1, cumulative probabilities the running sum (the last is 1), token ids distinct
and in the allowed set.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

TOL = 1e-9


def check_distribution(rows: Sequence[Sequence[float]], allowed: Collection[int], *,
                       complete: bool = True) -> None:
    """Assert rows of (token_id, probability[, cumulative]) form a valid distribution.

    `complete=False` when only the first rows of a distribution are given (an API `limit`).
    """
    assert rows, "a distribution needs at least one row"
    ids = [int(r[0]) for r in rows]
    probs = [float(r[1]) for r in rows]
    assert len(set(ids)) == len(ids), f"token ids repeat: {ids}"
    outside = [t for t in ids if t not in allowed]
    assert not outside, f"token ids {outside[:5]} are not in the atom set / vocabulary"
    assert all(math.isfinite(p) and 0.0 <= p <= 1.0 + TOL for p in probs), probs[:5]
    keys = [(-p, t) for t, p in zip(ids, probs)]
    assert keys == sorted(keys), "rows are not ordered by probability desc, token id asc"
    running = 0.0
    for r, p in zip(rows, probs):
        running += p
        if len(r) > 2 and r[2] is not None:
            assert abs(float(r[2]) - running) <= 1e-7, (r, running)
    if complete:
        assert abs(running - 1.0) <= TOL, f"probabilities sum to {running!r}, not 1"
    else:
        assert running <= 1.0 + TOL
