"""Repeated requests with the memory: the first and the second asking of each prompt as separate rows.

Each request gets a fresh speculative backend over the int4 runtime, as the server builds one per
request (drafts read the atom set's memory; every completed generation is remembered), with and
without the carried draft learning (hartonomous/speculative/learned.py). Greedy, EOS ignored; the
tokens are checked against the exact path's. Decode excludes the first round (which reads the
prompt): (total - first round) / (tokens after it). The set's memory must be empty at start (an
owner's memory is not clobbered) and is emptied at the end.

    .venv/bin/python -m benchmarks.speculative_repeat --atom-set smollm2-context
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

PROMPT_FILES = ("hartonomous/engine.py", "hartonomous/memory.py", "hartonomous/sampling.py")
PROMPT_TOKENS = 128


def prompts(tokenizer, count: int) -> list[list[int]]:
    """The first PROMPT_TOKENS tokens of a few of this repository's modules."""
    root = Path(__file__).resolve().parents[1]
    return [tokenizer.encode((root / f).read_text(encoding="utf-8"))[:PROMPT_TOKENS] for f in PROMPT_FILES[:count]]


def measure(result) -> dict:
    t = result.timings
    first_round = 1 + next((i for i, s in enumerate(t.per_token_s[1:]) if s > 0), len(t.per_token_s) - 1)
    after = len(result.token_ids) - first_round
    stats = result.stats
    return {"first_round_s": round(t.per_token_s[0], 4),
            "decode_ms_per_token": round(1000 * (t.total_s - t.per_token_s[0]) / after, 2) if after else None,
            "acceptance": None if stats is None else stats.acceptance_rate,
            "tokens_per_forward": None if stats is None else stats.tokens_per_forward,
            "first_draft": None if stats is None else stats.draft_lengths[0],
            "warm_start": None if stats is None else stats.warm_start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atom-set", default="smollm2-context")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--prompts", type=int, default=3)
    args = parser.parse_args(argv)

    import psycopg

    from hartonomous.backends.exact import ExactBackend
    from hartonomous.backends.spatial import SpatialBackend
    from hartonomous.db.connection import reader_url
    from hartonomous.engine import Engine
    from hartonomous.generation_config import GenerationConfig
    from hartonomous.memory import MemoryPolicy, MemoryWriter
    from hartonomous.runtimes import load_exact_model
    from hartonomous.speculative.decoding import SpeculativeBackend
    from hartonomous.speculative.draft_cost import forward_costs
    from hartonomous.speculative.learned import DraftLearning

    model = load_exact_model("int4", "smollm2", "cpu")
    conn = psycopg.connect(reader_url(), autocommit=True)
    spatial = SpatialBackend(conn, args.atom_set, tokenizer=model.tokenizer)
    writer = MemoryWriter(policy=MemoryPolicy(allow_ignore_eos=True))
    if writer.status(args.atom_set).atoms:
        print(f"atom set '{args.atom_set}' has a memory already; empty it (hartonomous memory forget) or pick "
              "another set", file=sys.stderr)
        return 2
    costs = forward_costs(model)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=0.0, stop_at_eos=False)
    ids = prompts(model.tokenizer, args.prompts)
    exact = Engine(ExactBackend(model))
    expected = [exact.generate(p, config) for p in ids]        # the first also warms the runtime
    expected = [exact.generate(p, config) for p in ids]
    rows = [{"method": "exact_int4", "asking": None, **measure(r)} for r in expected]
    try:
        for carried in (False, True):
            writer.forget(args.atom_set)
            learned = DraftLearning() if carried else None
            for asking in (1, 2):
                for p, want in zip(ids, expected):
                    backend = SpeculativeBackend(ExactBackend(model), spatial, costs=costs, memory=True,
                                                 max_draft_tokens=16, learned=learned)
                    result = Engine(backend, on_result=lambda r: writer.remember_result(args.atom_set, r)).generate(
                        p, config)
                    rows.append({"method": "speculative_memory_int4" + ("_carried" if carried else ""),
                                 "asking": asking, "identical": result.token_ids == want.token_ids,
                                 **measure(result)})
    finally:
        writer.forget(args.atom_set)
        writer.close()
    print(json.dumps({"command": " ".join(["python -m benchmarks.speculative_repeat", *(argv or sys.argv[1:])]),
                      "load": os.getloadavg(), "costs_ms": costs.as_dict()["ms"][:8], "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
