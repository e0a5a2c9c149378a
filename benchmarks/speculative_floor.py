"""Speculative decoding where drafts do not pay: is it ever slower than the exact path?

The CLI's own case (`hartonomous generate 'def fibonacci(n):' --max-new-tokens 48 --temperature 0`
on the default docstring set, whose drafts are prose where the model writes code): one process, the
model loaded and the forward costs read (or measured) once, then exact and speculative alternating,
generation time only. Writes the seconds, the speculative run's stats and the machine as JSON.
    PYTHONPATH=$PWD .venv/bin/python benchmarks/speculative_floor.py [--atom-set NAME] [--runs 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import time
from dataclasses import asdict

import psycopg

from hartonomous.client import Client
from hartonomous.db.connection import owner_url
from hartonomous.measure import describe_machine

PROMPT = "def fibonacci(n):"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atom-set", default=None, help="default: the default atom set")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    client = Client(model="smollm2", atom_set=args.atom_set)
    for path in ("exact", "speculative"):                      # the model's load, the costs' read or measurement
        client.generate(PROMPT, path=path, temperature=0, max_new_tokens=8)
    seconds: dict[str, list[float]] = {"exact": [], "speculative": []}
    loads = [os.getloadavg()[0]]
    outputs, stats = {}, None
    for _ in range(args.runs):
        for path in ("exact", "speculative"):
            start = time.perf_counter()
            result = client.generate(PROMPT, path=path, temperature=0, max_new_tokens=args.max_new_tokens)
            seconds[path].append(time.perf_counter() - start)
            outputs[path] = result.token_ids
            stats = result.stats if path == "speculative" else stats
        loads.append(os.getloadavg()[0])
    medians = {path: statistics.median(s) for path, s in seconds.items()}
    with psycopg.connect(owner_url()) as conn:
        machine = describe_machine(conn, "cpu", "smollm2")
    report = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "prompt": PROMPT,
              "command": "PYTHONPATH=$PWD .venv/bin/python benchmarks/speculative_floor.py "
                         + (f"--atom-set {args.atom_set} " if args.atom_set else "") + f"--runs {args.runs}",
              "max_new_tokens": args.max_new_tokens, "seconds": seconds, "median_s": medians,
              "speculative_over_exact": medians["speculative"] / medians["exact"],
              "same_tokens": outputs["exact"] == outputs["speculative"],
              "speculative_stats": asdict(stats) if stats is not None else None,
              "machine": {**machine, "load": loads}}
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(f"exact {medians['exact']:.3f} s, speculative {medians['speculative']:.3f} s "
          f"({report['speculative_over_exact']:.3f}x), same tokens: {report['same_tokens']}, load {loads}")


if __name__ == "__main__":
    main()
