"""The Markdown tables of docs/fidelity.md "Risk and hybrid routing" from benchmarks/risk_hybrid.py's JSON.

A summary row per text (with the ROC AUC another risk model, e.g. an earlier build's, gets on the
same positions: its risk recomputed from each position's recorded signals) and the hybrid curve.

    python benchmarks/risk_hybrid_tables.py --baseline docs/results/2026-11-24-risk-hybrid-8signals-test.json \
        test=docs/results/2026-11-24-risk-hybrid-test.json gpl3=...
"""

import argparse
import json
import math

import numpy as np
from sklearn.metrics import roc_auc_score

from hartonomous.risk import RiskModel

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("runs", nargs="+", help="NAME=FILE: a risk_hybrid.py result and the text's name in the tables")
parser.add_argument("--baseline", help="a risk_hybrid.py result whose risk_model is scored as the baseline column")
args = parser.parse_args()
texts = [run.split("=", 1) for run in args.runs]
old = RiskModel(**json.load(open(args.baseline))["risk_model"]) if args.baseline else None
print("| text | spatial top-1 | AUC, baseline model | AUC | hybrid @50% | random @50% | perfect @50% | gap R² | gap Pearson | gap Spearman | predicted gap's AUC |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name, path in texts:
    d = json.load(open(path))
    pp = d["per_position"]
    wrong = np.array([p["exact"] != p["spatial"] for p in pp])
    r8 = np.array([np.nan if old is None else old.predict(p) for p in pp], dtype=float)
    ok = np.isfinite(r8)
    auc8 = roc_auc_score(wrong[ok], r8[ok]) if ok.any() else math.nan
    c50 = [r for r in d["curve"] if abs(r["fraction_exact"] - 0.5) < 1e-9][0]
    top = d["spatial_top1_agreement"]; g = d["calibration_gap"]
    print(f"| {name} | {top:.3f} | {auc8:.3f} | **{d['roc_auc_wrong']:.3f}** | **{c50['hybrid_agreement']:.3f}** | {c50['random_expected']:.3f} | {min(1, 0.5 + top):.3f} | {g['r2']:.3f} | {g['pearson']:.3f} | {g['spearman']:.3f} | {g['roc_auc_wrong']:.3f} |")
print()
for name, path in texts:
    d = json.load(open(path))
    top = d["spatial_top1_agreement"]
    print(f"{name} (spatial top-1 {top:.3f}; signals median {d['signals_ms_median']:.1f} ms, next_token {d['next_token_ms_median']:.1f} ms, load {d['machine']['load_1min']:.1f}):\n")
    print("| f (steps to exact) | hybrid | random | perfect | threshold | ms/token, hybrid (exact share) | ms/token, random (exact share) |")
    print("|---|---|---|---|---|---|---|")
    for r in d["curve"]:
        f = r["fraction_exact"]; th = "∞" if math.isinf(r["threshold"]) else f"{r['threshold']:.3f}"
        hg, rg = r.get("hybrid_generation"), r.get("random_generation")
        gen = lambda x: "–" if not x else f"{x['ms_per_token']:.0f} ({(x['exact_fraction'] or 0):.2f})"
        fs = f"{f:.2f}".rstrip("0").rstrip(".") if f not in (0, 1) else str(int(f))
        b = "**" if 0 < f < 1 else ""
        print(f"| {fs} | {b}{r['hybrid_agreement']:.3f}{b} | {r['random_expected']:.3f} | {min(1, f + top):.3f} | {th} | {gen(hg)} | {gen(rg)} |")
    print()
