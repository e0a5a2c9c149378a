"""Generation throughput on the same prompts: spatial via the Python client loop, spatial
in-database (generate_tokens), and exact (KV-cached transformer) on CPU and on CUDA if present."""

from __future__ import annotations

import time

from hartonomous.client import Client
from hartonomous.measure import percentile

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Return the sum of the numbers in the list.",
)


def _rate(results) -> tuple[float, float]:
    tokens = sum(r.timings.tokens for r in results)
    seconds = sum(r.timings.total_s for r in results)
    per_token = [t for r in results for t in r.timings.per_token_s[1:]]
    ms = percentile(per_token, 50) * 1000 if per_token else (seconds / tokens * 1000 if tokens else float("nan"))
    return (tokens / seconds if seconds > 0 else 0.0), ms


def spatial(atom_set: str, new_tokens: int = 128) -> dict:
    with Client(atom_set=atom_set) as client:
        client.generate(PROMPTS[0], path="spatial", max_new_tokens=8, seed=0, stop_at_eos=False)  # warm-up
        loop = [client.generate(p, path="spatial", max_new_tokens=new_tokens, seed=i, stop_at_eos=False)
                for i, p in enumerate(PROMPTS)]
        client.generate(PROMPTS[0], path="spatial", in_database=True, max_new_tokens=8, seed=0, stop_at_eos=False)
        wall, tokens = 0.0, 0
        for i, p in enumerate(PROMPTS):
            start = time.perf_counter()
            r = client.generate(p, path="spatial", in_database=True, max_new_tokens=new_tokens, seed=i,
                                stop_at_eos=False)
            wall += time.perf_counter() - start
            tokens += len(r.token_ids)
    loop_rate, loop_ms = _rate(loop)
    return {
        "atom_set": atom_set,
        "new_tokens_per_prompt": new_tokens,
        "spatial_client_tokens_per_s": loop_rate,
        "spatial_client_ms_per_token": loop_ms,
        "spatial_in_db_tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "spatial_in_db_ms_per_token": wall / tokens * 1000 if tokens else None,
        "spatial_in_db_note": "wall time of one generate_tokens call per prompt, including the client round trip",
    }


def exact(device: str, new_tokens: int = 32) -> dict:
    with Client(device=device) as client:
        client.generate(PROMPTS[0], path="exact", max_new_tokens=4, temperature=0.0)  # load + warm-up
        runs = [client.generate(p, path="exact", max_new_tokens=new_tokens, temperature=0.0, stop_at_eos=False)
                for p in PROMPTS]
    rate, ms = _rate(runs)
    return {f"exact_{device}_tokens_per_s": rate, f"exact_{device}_ms_per_token": ms,
            f"exact_{device}_new_tokens_per_prompt": new_tokens}
