"""First token after a prompt on the int4 runtime: the row-at-a-time forward, the chunked prefill, and
a prompt that extends a recent one through the server's prefix cache.

The first token's time is the prefill's (its logits are the first token's distribution; the pick is
microseconds). Per prompt length: `rows` feeds the prompt as decoding does (one attention call per
row and layer, the int4 kernel: the prefill before 2026-12-02), `chunked` is the runtime's prefill
(chunks of batched attention on the unpacked weights), `extend` is a prompt of that length plus
`--extend` tokens after the prompt itself went through a PrefixCachedModel. Best of `--repeats`
after one warm-up; the machine's load average is recorded before and after, since the machine is
shared. Writes JSON to stdout (or --out).

    .venv/bin/python benchmarks/prefill.py --lengths 256,1024 --extend 32 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path


def held_out_ids(tokenizer, count: int) -> list[int]:
    """`count` tokens of the project's own Python source (any code does; this is at hand)."""
    root = Path(__file__).resolve().parent.parent / "hartonomous"
    ids: list[int] = []
    for path in sorted(root.rglob("*.py")):
        ids += tokenizer.encode(path.read_text())
        if len(ids) >= count:
            return ids[:count]
    raise SystemExit(f"not {count} tokens of source under {root}")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def commit() -> str | None:
    import subprocess

    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent)
    return done.stdout.strip() or None


def best(fn, repeats: int, before=lambda: None) -> float:
    fn()
    times = []
    for _ in range(repeats):
        before()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="256,1024", help="prompt lengths, comma-separated")
    parser.add_argument("--extend", type=int, default=32, help="tokens a warm prompt adds to a recent one")
    parser.add_argument("--threads", default=None,
                        help="torch threads, or 'auto': the server's default, chosen before each timed prefill "
                             "(hartonomous.runtimes.threads; default: torch's)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--skip-rows", action="store_true", help="leave out the row-at-a-time forward")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from hartonomous.runtimes import load_exact_model
    from hartonomous.runtimes.prefix_cache import with_prefix_cache
    from hartonomous.runtimes.threads import ThreadPolicy

    policy = ThreadPolicy(None if args.threads in (None, "auto") else int(args.threads))
    chosen: list[int] = []
    if args.threads is not None:
        policy.apply()
    load_before = os.getloadavg()
    model = load_exact_model("int4")

    def choose() -> None:
        if args.threads == "auto":
            chosen.append(policy.apply())

    lengths = [int(n) for n in args.lengths.split(",")]
    ids = held_out_ids(model.tokenizer, max(lengths) + args.extend)
    rows = []
    for n in lengths:
        prompt = ids[:n]
        row = {"tokens": n}
        if not args.skip_rows:
            row["rows_s"] = best(lambda: model._forward(prompt, model.new_cache(), None, None, 1), args.repeats, choose)
        row["chunked_s"] = best(lambda: model.prefill(prompt, model.new_cache()), args.repeats, choose)
        warm_model = with_prefix_cache(model, 1024)
        longer = ids[:n + args.extend]

        def warm() -> None:
            warm_model.prefix_cache._entries.clear()
            warm_model.prefix_cache.bytes = 0
            warm_model.prefill(prompt, warm_model.new_cache())
            choose()
            started = time.perf_counter()
            warm_model.prefill(longer, warm_model.new_cache())
            row.setdefault("extend_runs", []).append(time.perf_counter() - started)

        for _ in range(args.repeats + 1):
            warm()
        row["extend_s"] = min(row.pop("extend_runs")[1:])
        row["extend_tokens"] = args.extend
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"command": "benchmarks/prefill.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                             if v not in (None, False) and k != "out"),
              "commit": commit(), "date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": cpu_name(),
              "cores": os.cpu_count(), "torch_threads": args.threads or torch.get_num_threads(),
              "auto_threads_chosen": chosen or None,
              "load_average_before": load_before, "load_average_after": os.getloadavg(), "rows": rows}
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
