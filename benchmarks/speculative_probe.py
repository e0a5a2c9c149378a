"""Quick probe (not the benchmark): exact vs speculative greedy on SmolLM2, same prompts, one process.

Prints ms/token, identical-output check, acceptance rate, tokens per forward and the time split.
Needs the embedded database with an atom set built from SmolLM2 (default: the default set).
    PYTHONPATH=$PWD .venv/bin/python benchmarks/speculative_probe.py [--atom-set NAME] [--draft N]
"""

from __future__ import annotations

import argparse
import json
import time

import psycopg

from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.db.connection import owner_url
from hartonomous.engine import Engine
from hartonomous.runtimes.reference import ExactModel
from hartonomous.generation_config import GenerationConfig
from hartonomous.speculative.decoding import SpeculativeBackend

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.",
    "Return a new list containing the items of the iterable in sorted order. The sort is stable:",
    json.dumps.__doc__[:700],      # a stdlib docstring: the default corpus's domain (maybe its training slice)
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--atom-set", default=None)
    parser.add_argument("--draft", type=int, nargs="+", default=[4])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model = ExactModel.load("smollm2", device="cpu")
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0, stop_at_eos=False)
    exact = Engine(ExactBackend(model))
    exact.generate("warm up", config.with_options(max_new_tokens=4))
    with psycopg.connect(owner_url(), autocommit=True) as conn:
        spatial = SpatialBackend(conn, args.atom_set, tokenizer=model.tokenizer)
        print(f"atom set {spatial.atom_set.name}; greedy, {args.max_new_tokens} new tokens")
        for prompt in PROMPTS:
            t = time.perf_counter()
            ref = exact.generate(prompt, config)
            exact_ms = (time.perf_counter() - t) * 1000 / len(ref.token_ids)
            print(f"\n{prompt[:40]!r}: exact {exact_ms:.1f} ms/token")
            for k in args.draft:
                engine = Engine(SpeculativeBackend(ExactBackend(model), spatial, draft_tokens=k,
                                                   max_draft_tokens=max(k, 8)))
                t = time.perf_counter()
                got = engine.generate(prompt, config)
                ms = (time.perf_counter() - t) * 1000 / len(got.token_ids)
                s = got.stats
                print(f"  speculative draft={k}: {ms:.1f} ms/token ({exact_ms / ms:.2f}x) identical={got.token_ids == ref.token_ids} "
                      f"acceptance={s.acceptance_rate:.2f} tokens/forward={s.tokens_per_forward:.2f} rounds={s.rounds} "
                      f"draft {s.draft_s * 1000:.0f} ms, verify {s.verify_s * 1000:.0f} ms, decide {s.decide_s * 1000:.0f} ms")


if __name__ == "__main__":
    main()
