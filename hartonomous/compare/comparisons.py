"""The report's paired tests: the spatial path against every path its headline compares it with.

Each fidelity row of the headline names up to three other paths: the best baseline for that
metric, the random-positions control and the `--against` set. Each pair is tested on the
positions both were scored on (hartonomous.compare.intervals.paired_test, the same blocks and
seed everywhere) and the row is worded by the verdict. The perplexity row is tested on the
per-position NLL: perplexity = exp(mean NLL), so the NLL difference is the log of the
perplexity ratio.
"""

from __future__ import annotations

import numpy as np

from hartonomous.compare import intervals
from hartonomous.compare.controls import RANDOM_POSITIONS
from hartonomous.compare.fidelity import Fidelity

ROLES = ("baseline", "infinigram_cache", "random_positions", "against")   # the compared paths of a headline row
ROLE_WORDS = {"baseline": "best baseline", "infinigram_cache": "∞-gram + cache (the strongest counting model)",
              "random_positions": "random-positions control", "against": "other atom set"}
INFINIGRAM_CACHE = "∞-gram + cache"   # hartonomous.compare.baselines.INFINIGRAM_CACHE_PATH


def per_position_metric(key: str) -> str:
    """The per-position values a headline row is tested on (perplexity: the NLL)."""
    return "nll" if key == "perplexity" else key


def _compared_path(row: dict, role: str) -> str | None:
    if role == "baseline":
        return row.get("baseline_name")
    if role == "infinigram_cache":   # always tested, unless it already is the best baseline
        return INFINIGRAM_CACHE if row.get("baseline_name") != INFINIGRAM_CACHE else None
    if role == "random_positions":
        return RANDOM_POSITIONS if row.get("random_positions") is not None else None
    return row.get("against_name")


def paired_comparisons(fid: Fidelity, headline: list[dict], groups: np.ndarray | None = None) -> list[dict]:
    """One paired test per (fidelity headline row, compared path); sets each row's `verdicts`."""
    out = []
    spatial = fid.paths["spatial"]
    for row in headline:
        if "key" not in row:
            continue
        metric = per_position_metric(row["key"])
        row["verdicts"] = {}
        for role in ROLES:
            other = _compared_path(row, role)
            if other is None or other not in fid.paths:
                continue
            test = intervals.paired_test(spatial.array(metric), fid.paths[other].array(metric), groups,
                                         metric=metric, names=("spatial", other))
            row["verdicts"][role] = test.verdict
            out.append({"row": row["metric"], "metric": metric, "role": role, "a": test.a, "b": test.b,
                        "difference": test.difference,
                        "interval": None if test.low is None else [test.low, test.high],
                        "p": test.p_value, "n": test.n, "blocks": test.blocks, "verdict": test.verdict,
                        "wording": test.wording})
    return out


def interval_section(fid: Fidelity, max_positions: int, recommended: int) -> dict:
    """The report's `intervals`: how every ci95 and paired test was computed, and a note when n is small."""
    block, n = fid.block, fid.n
    blocks = int(len(np.unique(fid.blocks()))) if n else 0
    note = None
    if n < recommended:
        reason = (f"--max-positions {max_positions}" if max_positions < recommended
                  else f"the scored text gives only {n}")
        note = (f"n = {n} positions, fewer than the {recommended:,} compare scores by default ({reason}): the "
                f"intervals are wide and small differences read as \"no difference\"")
        if block < intervals.BLOCK:
            note += (f"; the blocks are {block} position{'s' if block != 1 else ''} long instead of "
                     f"{intervals.BLOCK}, so where neighbouring positions are correlated the intervals are "
                     "somewhat narrower than they should be")
    return {"method": intervals.method(block), "confidence": intervals.CONFIDENCE, "resamples": intervals.RESAMPLES,
            "block": block, "blocks": blocks, "seed": intervals.SEED, "positions": n,
            "recommended_positions": recommended, "note": note}
