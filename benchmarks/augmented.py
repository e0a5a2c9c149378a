"""`hartonomous bench --augmented`: what the augmented path costs over the exact path, per token.

Both paths run on one Client per runtime (one exact model, one reader connection), memory off,
greedy, with the same prompts; the order alternates per prompt (exact first on even prompts,
augmented first on odd ones), so load drift falls on both. A path's ms per token is the median of
its decode steps (every step but the first, which pays for the prefill) over all prompts. The
target: augmented <= exact + 1 ms per token (one store_distribution call and the mixture per step).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import psycopg

from benchmarks.speculative import SHORT_PROMPTS

PATHS = ("exact", "augmented")
TARGET_MS = 1.0                 # augmented may cost at most this much more per token than exact
WARM_UP = "Warm up the"


def measure(client, prompts: Sequence[str], max_new_tokens: int) -> dict:
    """Both paths on `client` (memory off): per path the median ms per decode step, the steps
    counted, and for the augmented path its mean λ; then the difference and whether the target holds."""
    options = dict(max_new_tokens=max_new_tokens, temperature=0.0, stop_at_eos=False, seed=0)
    for path in PATHS:                                     # first-call costs out of the timings
        client.generate(WARM_UP, path, **options)
    steps: dict[str, list[float]] = {p: [] for p in PATHS}
    weights: list[float] = []
    for i, prompt in enumerate(prompts):
        for path in (PATHS if i % 2 == 0 else PATHS[::-1]):
            result = client.generate(prompt, path, **options)
            steps[path] += result.timings.per_token_s[1:]
            if path == "augmented" and result.stats.mean_weight is not None:
                weights.append(result.stats.mean_weight)
    rows = {p: {"ms_per_token": 1000 * statistics.median(s) if s else None, "steps": len(s)}
            for p, s in steps.items()}
    rows["augmented"]["mean_weight"] = statistics.fmean(weights) if weights else None
    exact, augmented = rows["exact"]["ms_per_token"], rows["augmented"]["ms_per_token"]
    difference = augmented - exact if exact is not None and augmented is not None else None
    return {"runtime": client.exact_runtime, "methods": rows, "difference_ms": difference,
            "target_ms": TARGET_MS, "met": difference is not None and difference <= TARGET_MS}


def run(url: str, *, atom_set: str | None = None, runtimes: Sequence[str | None] = (None,),
        prompts: Sequence[str] = SHORT_PROMPTS[:3], max_new_tokens: int = 32, threads: int | None = None) -> dict:
    """`measure` on each runtime (None: the configured one), each with its own Client and model."""
    import torch

    from hartonomous import measure as machine
    from hartonomous.client import Client

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    torch.set_num_threads(threads or min(machine.host()["cores"] or 1, 4))
    rows = []
    with psycopg.connect(url, autocommit=True) as conn:
        for runtime in runtimes:
            with Client(connection=conn, atom_set=atom_set, runtime=runtime) as client:
                rows.append(measure(client, prompts, max_new_tokens))
                name = client.engine("augmented").atom_set
        described = machine.describe_machine(conn, "cpu", "smollm2")
    return {"mode": "augmented", "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "atom_set": name, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "torch_threads": torch.get_num_threads(), "memory": False, "runtimes": rows, "machine": described}


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "n/a" if value is None else format(value, fmt)


def markdown(results: dict, command: str) -> str:
    m = results["machine"]
    lines = [f"# Augmented vs exact, ms per generated token (`{command}`)", "",
             f"Atom set {results['atom_set']}; {results['prompts']} prompts x {results['max_new_tokens']} tokens, "
             f"greedy, memory off; median of the decode steps. Machine: {m.get('cpu')}, {m.get('cores')} cores, "
             f"load average {m.get('load_average')}.", "",
             "| runtime | exact ms/token | augmented ms/token | difference ms | mean λ | target (<= +1 ms) |",
             "|---|---|---|---|---|---|"]
    for row in results["runtimes"]:
        e, a = row["methods"]["exact"], row["methods"]["augmented"]
        lines.append(f"| {row['runtime']} | {_f(e['ms_per_token'])} | {_f(a['ms_per_token'])} | "
                     f"{_f(row['difference_ms'], '+.2f')} | {_f(a['mean_weight'], '.3f')} | "
                     f"{'met' if row['met'] else 'not met'} |")
    return "\n".join(lines) + "\n"
