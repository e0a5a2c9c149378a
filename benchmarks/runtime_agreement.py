"""How exact is each fast runtime? Agreement with the float32 reference on compare's positions.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/runtime_agreement.py [--atom-set NAME | --text FILE]
        [--max-positions 2000] [--runtimes int4,llama] [--out FILE.json]

The reference is the torch runtime (transformers in float32, hartonomous.runtimes.reference). For each fast runtime,
teacher-forced on the positions `compare` scores (the atom set's held-out test half, split by compare's
own budget; or the given text): top-1 agreement with the reference, max / median / p99 |Δ logit|, and at
every position where the argmax differs the reference's own top-2 logit gap there, checked against the
near-tie threshold NEAR_TIE (fixed before measuring). Then greedy generation from the bench's short
prompts: the length of the prefix each runtime shares with the reference's greedy output, and the
reference's top-2 gap at the first differing step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

NEAR_TIE = 0.5          # logits: a divergence where the reference's top-2 gap is below this is a near-tie
CHUNK = 256             # teacher-forced rows per forward (bounds the logits held at once)
GREEDY_TOKENS = 64


def teacher_forced(model, ids: list[int], keep: int) -> "torch.Tensor":  # noqa: F821
    """Logits (keep, V) of the last `keep` positions of `ids`, in chunks of CHUNK rows."""
    import torch

    rows, start = [], len(ids) - keep
    for end in range(start + CHUNK, len(ids) + CHUNK, CHUNK):
        end = min(end, len(ids))
        rows.append(model.full_logits_many(ids[:end], end - start))
        start = end
    return torch.cat(rows)


def agreement(reference, candidate, texts: list[list[int]], keeps: list[int]) -> dict:
    """Teacher-forced top-1 agreement and |Δ logit| of `candidate` against `reference` on the positions."""
    import torch

    agree = total = 0
    deltas, gaps = [], []
    for ids, keep in zip(texts, keeps):
        if keep < 2:
            continue
        ref = teacher_forced(reference, ids[:keep], keep - 1)
        got = teacher_forced(candidate, ids[:keep], keep - 1)
        same = ref.argmax(-1) == got.argmax(-1)
        agree += int(same.sum())
        total += len(same)
        deltas.append((ref - got).abs().flatten()[::97])        # a strided sample keeps the quantiles cheap
        top2 = ref.topk(2, -1).values
        gaps += (top2[:, 0] - top2[:, 1])[~same].tolist()
    d = torch.cat(deltas)
    return {"positions": total, "top1_agreement": agree / total, "divergences": total - agree,
            "max_abs_delta_logit_sampled": float(d.max()), "median_abs_delta_logit": float(d.median()),
            "p99_abs_delta_logit": float(d.quantile(0.99)), "reference_gaps_at_divergences": sorted(gaps),
            "all_divergences_near_ties": all(g < NEAR_TIE for g in gaps),
            "largest_gap_at_a_divergence": max(gaps, default=None)}


def greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens from the runtime's own KV-cached steps (EOS ignored)."""
    cache = model.new_cache()
    logits, out = model.prefill(ids, cache), []
    for _ in range(n):
        out.append(int(logits.argmax()))
        logits = model.decode_one_token(out[-1], cache)
    return out


def greedy_prefixes(reference, candidate, prompts: list[list[int]]) -> list[dict]:
    rows = []
    for ids in prompts:
        a, b = greedy(reference, ids, GREEDY_TOKENS), greedy(candidate, ids, GREEDY_TOKENS)
        shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
        gap = None
        if shared < len(a):
            top2 = reference.full_logits(ids + a[:shared]).topk(2).values
            gap = float(top2[0] - top2[1])
        rows.append({"prompt_tokens": len(ids), "shared_prefix": shared, "of": len(a), "reference_gap_at_split": gap})
    return rows


def positions(atom_set: str | None, text: Path | None, tokenizer, max_positions: int) -> tuple[str, list, list]:
    """compare's evaluation texts and its per-text budget of kept tokens."""
    from hartonomous.compare.runner import budget

    if text is not None:
        texts, source = [text.read_text(encoding="utf-8")], str(text)
    else:
        from hartonomous.atomset import load_atom_set
        from hartonomous.compare.atomset import holdout_text
        from hartonomous.db.connection import connect, reader_url

        with connect(reader_url(), autocommit=True) as conn:
            info = load_atom_set(conn, atom_set)
            texts, source = [holdout_text(info, "test").text], f"atom set {info.name}, held-out test half"
    encoded = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    return source, encoded, budget([len(e) for e in encoded], max_positions, 8192)


def main(argv: list[str] | None = None) -> int:
    import torch

    from benchmarks.speculative import SHORT_PROMPTS
    from hartonomous import measure
    from hartonomous.runtimes.reference import ExactModel
    from hartonomous.runtimes import load_exact_model
    from hartonomous.threads import machine_threads

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atom-set", default=None)
    parser.add_argument("--text", type=Path, default=None)
    parser.add_argument("--max-positions", type=int, default=2000)
    parser.add_argument("--runtimes", default=None, help="comma-separated (default: int4, and llama where installed)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    from benchmarks.speculative import fast_runtimes

    runtimes = tuple(args.runtimes.split(",")) if args.runtimes else fast_runtimes()
    torch.set_num_threads(machine_threads())
    started, load = time.strftime("%Y-%m-%dT%H:%M:%S%z"), list(measure.load_average())
    reference = ExactModel.load("smollm2", "cpu")
    source, texts, keeps = positions(args.atom_set, args.text, reference.tokenizer, args.max_positions)
    prompts = [reference.tokenizer.encode(p) for p in SHORT_PROMPTS]
    results = {"command": "PYTHONPATH=$PWD .venv/bin/python benchmarks/runtime_agreement.py " + " ".join(
                   sys.argv[1:] if argv is None else argv),
               "started": started, "positions_from": source, "near_tie_threshold": NEAR_TIE,
               "cpu": measure.host().get("cpu"), "load_average_before": load, "runtimes": {}}
    for name in runtimes:
        model = load_exact_model(name, "smollm2", "cpu")
        results["runtimes"][name] = {"teacher_forced": agreement(reference, model, texts, keeps),
                                     "greedy": greedy_prefixes(reference, model, prompts)}
        print(name, json.dumps(results["runtimes"][name]["teacher_forced"])[:400], flush=True)
    results["load_average_after"] = list(measure.load_average())
    text = json.dumps(results, indent=1)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
