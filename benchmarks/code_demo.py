"""The code store's figures for `make demo` (scripts/demo.sh): what the project is for, on held-out Python.

    python -m benchmarks.code_demo --atom-set code [--positions 2048] [--new-tokens 48] [--out reports/code]

On the test half of the set's held-out files (whole files the build never read, held out by path):
- exact against augmented: perplexity and top-1 against the real text, with 95 % block-bootstrap
  intervals and the paired change (benchmarks/augmented_quality.py's scoring, the set's own gate);
- speculative against exact: greedy from one held-out prompt, first token and decode apart, and
  whether the two outputs are the same tokens;
- spatial, for the record: its greedy continuation of the same prompt and how many of its first
  tokens agree with exact's.
Writes OUT/summary.json (every figure, the command, the machine's load), OUT/summary.md and
OUT/summary.txt (the five lines), and
prints a five-line summary last. Small by default so that `make demo` stays within its budget;
the intervals say how small.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

PROMPT_TOKENS = 96                      # the held-out prompt: a file's first tokens


def quality(conn, info, gate, positions: int) -> dict:
    """Exact and augmented against the real text on the first `positions` held-out test positions."""
    from benchmarks.augmented_quality import score_walk
    from hartonomous.atomset import model_name_for
    from hartonomous.augment.calibrate import WINDOW, walk_text
    from hartonomous.compare.atomset import holdout_text
    from hartonomous.corpus import teacher
    from hartonomous.model import load_model, load_tokenizer

    name = model_name_for(info)
    model, tokenizer = load_model(name, "cpu"), load_tokenizer(name)
    text = holdout_text(info, "test").text
    ids = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]][:positions + 1]
    start = time.perf_counter()
    walk = walk_text(conn, model, teacher.windows(ids, WINDOW), info.name)
    result = score_walk(walk, gate)
    result["seconds"] = round(time.perf_counter() - start, 1)
    return result


def held_out_prompt(info, tokenizer) -> list[int]:
    """The first PROMPT_TOKENS tokens of the held-out test text (a file the build never read)."""
    from hartonomous.compare.atomset import holdout_text

    text = holdout_text(info, "test").text
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]][:PROMPT_TOKENS]


def timed(client, prompt: list[int], path: str, new_tokens: int) -> dict:
    result = client.generate(prompt, path=path, temperature=0.0, max_new_tokens=new_tokens, stop_at_eos=False)
    t = result.timings
    return {"path": path, "token_ids": result.token_ids, "text": result.text, "tokens": len(result.token_ids),
            "first_token_s": t.time_to_first_token_s, "decode_tokens_per_s": t.decode_tokens_per_second,
            "total_s": t.total_s, "tokens_per_s": t.tokens_per_second}


def generations(info, new_tokens: int) -> dict:
    """Exact, speculative and spatial, greedy, on one held-out prompt (one client: one exact model)."""
    from hartonomous.client import Client

    with Client(atom_set=info.name, model=info.model_key) as client:     # the model the set was built from
        prompt = held_out_prompt(info, client.engine("exact").tokenizer)   # loads the model before any timing
        for path in ("exact", "speculative"):               # warm: the runtime's first prefill of this length,
            timed(client, prompt, path, 2)                  # the drafter's one-off timing of the forwards
        runs = {path: timed(client, prompt, path, new_tokens) for path in ("exact", "speculative", "spatial")}
    exact, spatial = runs["exact"]["token_ids"], runs["spatial"]["token_ids"]
    agree = next((i for i, (a, b) in enumerate(zip(exact, spatial)) if a != b), min(len(exact), len(spatial)))
    return {"prompt_tokens": len(prompt), "runs": runs,
            "speculative_identical": runs["speculative"]["token_ids"] == exact,
            "spatial_agrees_with_exact_for": agree}


def pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def ci(interval: dict, fmt: str = "{:.2f}") -> str:
    low, high = interval["ci95"]
    return f"{fmt.format(interval['estimate'])} [{fmt.format(low)}, {fmt.format(high)}]"


def summary_lines(report: dict) -> list[str]:
    """Five lines: the store, perplexity, top-1, speculative against exact, spatial."""
    q, g, s = report["quality"], report["generation"], report["atom_set"]
    ex, au = q["exact"], q["augmented"]
    runs = g["runs"]
    speed = lambda r: f"{r['decode_tokens_per_s']:.1f} tok/s" if r["decode_tokens_per_s"] else "n/a"  # noqa: E731
    first = lambda r: f"{r['first_token_s']:.2f} s" if r["first_token_s"] is not None else "n/a"  # noqa: E731
    change = q["perplexity_change"]
    return [
        f"code store '{s['name']}': {s['atoms']:,} atoms from {s['training_tokens']:,} tokens of python-source "
        f"(lattice keys, corpus labels, a gate); scored on {q['positions']} held-out positions (files held out by path)",
        f"perplexity on held-out Python: exact {ci(ex['perplexity'])}, augmented {ci(au['perplexity'])}; "
        f"change {pct(change['estimate'])} [{pct(change['ci95'][0])}, {pct(change['ci95'][1])}] ({change['verdict']})",
        f"top-1 against the real text: exact {ci(ex['top1'], '{:.3f}')}, augmented {ci(au['top1'], '{:.3f}')}; "
        f"change {q['top1_change']['estimate']:+.3f} ({q['top1_change']['verdict']})",
        f"speculative vs exact, {runs['exact']['tokens']} greedy tokens: output "
        f"{'identical' if g['speculative_identical'] else 'DIFFERENT'}; decode {speed(runs['speculative'])} vs "
        f"{speed(runs['exact'])}; first token {first(runs['speculative'])} vs {first(runs['exact'])}",
        f"spatial, for the record: {runs['spatial']['tokens_per_s']:.1f} tok/s, agrees with exact for its first "
        f"{g['spatial_agrees_with_exact_for']} of {runs['spatial']['tokens']} tokens "
        f"(the SQL next_token alone; exact and augmented carry the quality)",
    ]


def markdown(report: dict, lines: list[str]) -> str:
    runs = report["generation"]["runs"]
    body = ["# The code store on held-out Python", "", f"`{report['command']}`; load {report['load']}", "",
            *[f"- {line}" for line in lines], "", "## The continuations (greedy, from a held-out file's first "
            f"{report['generation']['prompt_tokens']} tokens)", ""]
    for path, run in runs.items():
        body += [f"### {path}", "", "```python", run["text"], "```", ""]
    return "\n".join(body)


def main() -> None:
    import psycopg

    from hartonomous.atomset import load_atom_set
    from hartonomous.augment.gates import load_gate
    from hartonomous.db.connection import reader_url
    from hartonomous.measure import load_average

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atom-set", required=True)
    parser.add_argument("--positions", type=int, default=2048, help="Held-out positions scored (default 2,048).")
    parser.add_argument("--new-tokens", type=int, default=48, help="Greedy tokens per path (default 48).")
    parser.add_argument("--out", type=Path, default=Path("reports/code"))
    args = parser.parse_args()

    load_start = load_average()
    with psycopg.connect(reader_url(), autocommit=True) as conn:
        info = load_atom_set(conn, args.atom_set)
        gate = load_gate(conn, info.name)
        scored = quality(conn, info, gate, args.positions)
    started = time.perf_counter()
    generated = generations(info, args.new_tokens)
    generated["seconds"] = round(time.perf_counter() - started, 1)
    report = {
        "command": f"python -m benchmarks.code_demo --atom-set {args.atom_set} --positions {args.positions} "
                   f"--new-tokens {args.new_tokens} --out {args.out}",
        "atom_set": {"name": info.name, "atoms": info.atoms, "training_tokens": info.stats.corpus.train_tokens},
        "quality": scored, "generation": generated,
        "load": {"start": load_start, "end": load_average()},
    }
    lines = summary_lines(report)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    (args.out / "summary.md").write_text(markdown(report, lines) + "\n")
    (args.out / "summary.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    if not math.isfinite(scored["exact"]["perplexity"]["estimate"]):
        raise SystemExit("error: the exact perplexity is not finite; the held-out text is too short")


if __name__ == "__main__":
    main()
