"""Free generation side by side: both paths through the one engine, greedy and one seeded sample.

Latency is the engine's compute time per token. The first token also pays for the prompt
(prefill), so p50/p95 are taken over the tokens after the first; time to first token and
tokens/s (all tokens / total time, prefill included) are reported beside them. The pooled p50
carries a 95 % bootstrap interval over whole generations (median_ci95).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hartonomous.compare.intervals import bootstrap_interval
from hartonomous.errors import UserError
from hartonomous.measure import percentile

PATHS = ("spatial", "exact")
MODES = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 1.0, "top_k": 40, "top_p": 0.9}}

DEFAULT_PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, there was a",
    "The license grants you the right to",
)


def _one(result) -> dict:
    steps = [s * 1000 for s in result.timings.per_token_s]
    rest = steps[1:]
    return {
        "text": result.text, "token_ids": list(map(int, result.token_ids)), "tokens": len(result.token_ids),
        "finish_reason": result.finish_reason,
        "ttft_ms": steps[0] if steps else None,
        "p50_ms": percentile(rest, 50),
        "p95_ms": percentile(rest, 95),
        "tokens_per_s": result.timings.tokens_per_second or None,
    }


def median_ci95(values: list[float], groups: list[int] | None = None) -> list[float] | None:
    """95 % bootstrap interval of the median of `values`, resampling whole `groups` (each
    generation's tokens together: a run's steps share its load and cache state); None with fewer
    than 2 groups. It says how stable the median is on this machine in this run, nothing of
    another machine."""
    if not values:
        return None
    iv = bootstrap_interval(np.asarray(values, dtype=np.float64), groups, statistic=np.median)
    return None if iv.low is None else [iv.low, iv.high]


def _latency(per_token_ms: list[float], tokens: int, total_s: float, groups: list[int] | None = None) -> dict:
    return {"tokens": tokens,
            "p50_ms": percentile(per_token_ms, 50),
            "p50_ms_ci95": median_ci95(per_token_ms, groups),
            "p95_ms": percentile(per_token_ms, 95),
            "tokens_per_s": tokens / total_s if total_s > 0 else None}


def side_by_side(client, prompts: list[str], *, max_new_tokens: int = 32, seed: int = 0,
                 on_step: Callable[[], None] | None = None) -> dict:
    """For each prompt: greedy and seeded-sample outputs of both paths, plus pooled latency per path."""
    rows = []
    pooled = {p: {"ms": [], "groups": [], "tokens": 0, "total_s": 0.0} for p in PATHS}
    for prompt in prompts:
        row: dict = {"prompt": prompt}
        for mode, options in MODES.items():
            row[mode] = {}
            for path in PATHS:
                try:
                    result = client.generate(prompt, path=path, max_new_tokens=max_new_tokens,
                                             seed=seed, **options)
                except UserError as exc:
                    raise UserError(f"free generation on the {path} path failed for prompt {prompt!r}: {exc}") from exc
                row[mode][path] = _one(result)
                ms = [s * 1000 for s in result.timings.per_token_s]
                pooled[path]["ms"] += ms[1:]
                pooled[path]["groups"] += [len(rows) * len(MODES) + list(MODES).index(mode)] * len(ms[1:])
                pooled[path]["tokens"] += len(result.token_ids)
                pooled[path]["total_s"] += result.timings.total_s
                if on_step:
                    on_step()
        rows.append(row)
    return {
        "seed": seed, "max_new_tokens": max_new_tokens,
        "modes": {"greedy": "temperature 0 (argmax)",
                  "sampled": f"temperature 1, top-k 40, top-p 0.9, seed {seed} (the same random numbers on both paths)"},
        "prompts": rows,
        **{path: _latency(pooled[path]["ms"], pooled[path]["tokens"], pooled[path]["total_s"], pooled[path]["groups"])
           for path in PATHS},
    }


def steps(prompts: list[str]) -> int:
    """How many generations side_by_side runs (for a progress bar)."""
    return len(prompts) * len(MODES) * len(PATHS)
