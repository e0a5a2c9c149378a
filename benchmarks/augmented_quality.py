"""The augmented path against the real text: perplexity, top-1 and calibration, exact vs augmented.

    python -m benchmarks.augmented_quality --atom-set code-src-1e7 [--text FILE ...] [--max-positions N]
        [--json OUT]

On the set's test split (always) and on each `--text` file: the exact reference model's
teacher-forced distribution and the store's (store_distribution) at every position
(hartonomous.augment.calibrate.walk_text: windows of 1,024 tokens), the set's stored gate (fitted
on the calibration split: never on these texts), then per position the NLL of the real next token,
whether the argmax is it, and the top probability. Intervals: compare's block bootstrap (blocks of
32 consecutive positions of one text), the paired difference augmented − exact for NLL and top-1
(the relative perplexity change is exp of the NLL difference − 1, with its interval).
Expected calibration error: compare's (hartonomous.compare.real_text, 10 equal-width bins).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

from hartonomous.augment.gate import FEATURES
from hartonomous.compare.intervals import BLOCK, bootstrap_interval, paired_test
from hartonomous.compare.real_text import expected_calibration_error

def interval(values, groups, transform=None) -> dict:
    i = bootstrap_interval(values, groups, transform=transform)
    return {"estimate": i.estimate, "ci95": [i.low, i.high]}


def score_walk(walk, gate) -> dict:
    """Exact (λ = 0) and augmented (the gate's λ) on one walk's positions."""
    lam = gate.weights(walk.matrix())
    groups = np.asarray(walk.text_index) * 1_000_000 + np.asarray(walk.position) // BLOCK
    out = {"positions": len(walk), "mean_weight": float(lam.mean()),
           "weight_quartiles": [float(q) for q in np.percentile(lam, [25, 50, 75])]}
    scored = {"exact": walk.scores(np.zeros(len(walk))), "augmented": walk.scores(lam)}
    for name, s in scored.items():
        out[name] = {"perplexity": interval(s["nll"], groups, math.exp), "top1": interval(s["top1"], groups),
                     "ece": expected_calibration_error(s["confidence"], s["top1"])}
    # Where the store's evidence came from: positions whose whole key window matched (D / h <= 1e-12), and
    # whether the matched mass was mostly the text's own history or the stored corpus.
    x = walk.matrix()
    history = x[:, FEATURES.index("history_share")] >= 0.5
    whole = x[:, FEATURES.index("exact_match")] == 1.0
    gain = scored["augmented"]["nll"] - scored["exact"]["nll"]
    out["breakdown"] = {
        name: {"share": float(mask.mean()),
               "perplexity_change": math.expm1(float(gain[mask].mean())) if mask.any() else None}
        for name, mask in {"whole window matched, mostly stored": whole & ~history,
                           "whole window matched, mostly history": whole & history,
                           "shorter match, mostly stored": ~whole & ~history,
                           "shorter match, mostly history": ~whole & history}.items()}
    nll = paired_test(scored["augmented"]["nll"], scored["exact"]["nll"], groups, metric="nll",
                      names=("augmented", "exact"), higher_is_better=False)
    top1 = paired_test(scored["augmented"]["top1"], scored["exact"]["top1"], groups, metric="top1",
                       names=("augmented", "exact"), higher_is_better=True)
    out["perplexity_change"] = {"estimate": math.expm1(nll.difference),
                                "ci95": [math.expm1(nll.low), math.expm1(nll.high)], "p": nll.p_value,
                                "verdict": nll.verdict}
    out["top1_change"] = {"estimate": top1.difference, "ci95": [top1.low, top1.high], "p": top1.p_value,
                          "verdict": top1.verdict}
    return out


def walk_text_into(together, walk) -> None:
    """Append one text's walk to a combined one (its positions keep their text index)."""
    for key, values in vars(walk).items():
        getattr(together, key).extend(values)


def main() -> None:
    import psycopg

    from hartonomous.atomset import load_atom_set, model_name_for
    from hartonomous.augment.calibrate import WINDOW, Walk, walk_text
    from hartonomous.augment.gates import load_gate
    from hartonomous.compare.atomset import holdout_text
    from hartonomous.corpus import teacher
    from hartonomous.db.connection import reader_url
    from hartonomous.measure import describe_machine, load_average
    from hartonomous.model import load_model, load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--atom-set", required=True)
    parser.add_argument("--text", action="append", default=[], type=Path, help="Another text to score (repeatable).")
    parser.add_argument("--max-positions", type=int, default=None, help="Per text (default: all).")
    parser.add_argument("--max-neighbors", type=int, default=100)
    parser.add_argument("--no-test-split", action="store_true", help="Score the --text files only.")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    url = reader_url()
    load_start = load_average()
    report = {"command": "python -m benchmarks.augmented_quality " + " ".join(
                  [f"--atom-set {args.atom_set}"] + [f"--text {t}" for t in args.text]
                  + ([f"--max-positions {args.max_positions}"] if args.max_positions else [])
                  + ([f"--max-neighbors {args.max_neighbors}"] if args.max_neighbors != 100 else [])
                  + (["--no-test-split"] if args.no_test_split else [])),
              "atom_set": args.atom_set, "max_neighbors": args.max_neighbors, "texts": {}}
    with psycopg.connect(url, autocommit=True) as conn:
        info = load_atom_set(conn, args.atom_set)
        gate = load_gate(conn, info.name)
        model_name = model_name_for(info)
        model, tokenizer = load_model(model_name, "cpu"), load_tokenizer(model_name)
        report["gate"] = gate.as_dict()
        texts = {} if args.no_test_split else {"test split": holdout_text(info, "test").text}
        texts.update({str(t): t.read_text(encoding="utf-8") for t in args.text})
        together = Walk()                      # every --text file in one walk (their own blocks)
        for index, (name, text) in enumerate(texts.items()):
            ids = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
            if args.max_positions:
                ids = ids[:args.max_positions + 1]
            start = time.perf_counter()
            walk = walk_text(conn, model, teacher.windows(ids, WINDOW), info.name, max_neighbors=args.max_neighbors,
                             text_index=index)
            if name != "test split":
                walk_text_into(together, walk)
            result = score_walk(walk, gate)
            result["seconds"] = round(time.perf_counter() - start, 1)
            report["texts"][name] = result
            print(json.dumps({name: {k: result[k] for k in ("positions", "perplexity_change", "top1_change",
                                                             "mean_weight")}}, indent=1), flush=True)
        if len(args.text) > 1:
            report["texts"]["all --text files"] = score_walk(together, gate)
            print(json.dumps({"all --text files": report["texts"]["all --text files"]["perplexity_change"]}),
                  flush=True)
        report["machine"] = describe_machine(conn, "cpu", model_name)
    report["machine"]["load"] = {"start": load_start, "end": load_average()}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=float) + "\n")


if __name__ == "__main__":
    main()
