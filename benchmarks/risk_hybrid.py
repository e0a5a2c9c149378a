"""Risk predictor and hybrid routing, measured (issue 16; docs/fidelity.md "Risk and hybrid routing").

For one text (the atom set's test half by default, or --text FILE) and the first --positions
positions: the exact argmax after every prefix (teacher forcing), the spatial top-1 (SQL
next_token, greedy) and the spatial signals with the predicted risk (SQL next_token_signals).
Reports the predictor's ROC AUC for "spatial top-1 is wrong", and the hybrid curve: at each
fraction f of steps sent to the exact model (the f riskiest, i.e. a threshold at the risk's
quantile), the per-step teacher-forced agreement with exact greedy (an exact step agrees by
definition, a spatial step when its top-1 is the exact argmax), next to random routing at the same
fraction (f + (1 - f) x spatial agreement in expectation, and one seeded draw). ms/token comes from
real greedy generations on the hybrid path (`Engine(HybridBackend)`) at thresholds giving those
fractions on this text, and from a random router at the same fractions (`--gen-prompts 0`: none).
Also the calibration-gap regression: per position the actual NLL - H of the spatial kernel
distribution (SQL next_token at temperature 1, no top-k/top-p; NLL of the text's next token,
capped at ln V as at build time: projection/risk.py calibration_gap) against next_token_signals'
predicted_gap: R^2, Pearson and Spearman correlation, and the predicted gap's own ROC AUC for
"spatial top-1 is wrong".

    PYTHONPATH=$PWD .venv/bin/python benchmarks/risk_hybrid.py --atom-set ctx20 --out result.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import psycopg
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import r2_score

from hartonomous import sqlcalls
from hartonomous.atomset import load_atom_set
from hartonomous.backends.base import SamplerArgs
from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.hybrid import HybridBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.compare.routing import risk_auc, routing_curve
from hartonomous.db.connection import owner_url
from hartonomous.engine import Engine, GenerationConfig
from hartonomous.runtimes.reference import ExactModel
from hartonomous.splits import recorded_halves
from hartonomous.corpus.teacher import teacher_force
from projection.risk import calibration_gap

FRACTIONS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
GREEDY = SamplerArgs(0.0, None, 1.0, 1.0)
KERNEL = SamplerArgs(1.0, None, 1.0, 1.0)          # the kernel's own distribution, as the signals read it


class RandomRouter(HybridBackend):
    """Benchmark control: each step goes to the exact model with probability `fraction` (seeded)."""

    def __init__(self, spatial, exact, fraction: float, seed: int = 0):
        super().__init__(spatial, exact, 1.0)
        self.fraction, self.rng = fraction, np.random.default_rng(seed)

    def route(self, state) -> str:
        return "exact" if self.rng.random() < self.fraction else "spatial"


def per_position(conn, atom_set: str, ids: list[int], vocab_size: int) -> dict:
    """Spatial top-1, risk, actual and predicted calibration gap, and the time of each SQL call, for
    every prefix of ids (all but the last)."""
    top, risk, signals, gap, t_top, t_sig = [], [], [], [], [], []
    nll_cap = math.log(vocab_size)
    for t in range(1, len(ids)):
        t0 = time.perf_counter()
        rows = sqlcalls.next_token(conn, ids[:t], GREEDY, atom_set=atom_set)
        t1 = time.perf_counter()
        s = sqlcalls.next_token_signals(conn, ids[:t], atom_set=atom_set)
        t2 = time.perf_counter()
        top.append(rows[0][0] if rows else -1)
        risk.append(s.risk)
        signals.append(s.as_dict())
        dist = sqlcalls.next_token(conn, ids[:t], KERNEL, atom_set=atom_set)
        gap.append(calibration_gap(np.array([r[0] for r in dist]), np.array([r[1] for r in dist]), s.h, ids[t],
                                   nll_cap) if dist else None)
        t_top.append(t1 - t0)
        t_sig.append(t2 - t1)
    return {"top": np.array(top), "risk": np.array(risk, dtype=float), "signals": signals,
            "gap": np.array(gap, dtype=float),
            "next_token_ms": 1000 * float(np.median(t_top)), "signals_ms": 1000 * float(np.median(t_sig))}


def curve(risk: np.ndarray, right: np.ndarray, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for p in routing_curve(risk, right, FRACTIONS):
        drawn = rng.random(len(risk)) < p.fraction
        rows.append({"fraction_exact": p.fraction_exact, "hybrid_agreement": p.agreement,
                     "random_expected": p.random_agreement,
                     "random_drawn": float(np.mean(drawn | right)), "drawn_fraction": float(drawn.mean()),
                     "threshold": p.threshold})
    return rows


def gap_quality(actual: np.ndarray, predicted: np.ndarray, wrong: np.ndarray) -> dict | None:
    """How well the predicted calibration gap matches the actual one (positions where both exist)."""
    ok = np.isfinite(actual) & np.isfinite(predicted)
    if ok.sum() < 3:
        return None
    a, p = actual[ok], predicted[ok]
    return {"positions": int(ok.sum()), "actual_mean": float(a.mean()), "predicted_mean": float(p.mean()),
            "r2": float(r2_score(a, p)), "pearson": float(pearsonr(a, p)[0]), "spearman": float(spearmanr(a, p)[0]),
            "roc_auc_wrong": risk_auc(wrong[ok], p)}


def timed_generation(engine: Engine, prompts: list[list[int]], tokens: int) -> dict:
    ms, fractions = [], []
    for prompt in prompts:
        result = engine.generate(prompt, GenerationConfig(max_new_tokens=tokens, temperature=0.0, stop_at_eos=False))
        rate = result.timings.decode_tokens_per_second
        ms.append(1000 / rate if rate else float("nan"))
        if result.stats is not None:
            fractions.append(result.stats.exact_fraction)
    return {"ms_per_token": float(np.mean(ms)), "exact_fraction": float(np.mean(fractions)) if fractions else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--atom-set", default="ctx20")
    parser.add_argument("--text", default=None, help="UTF-8 file (default: the atom set's test half)")
    parser.add_argument("--positions", type=int, default=500)
    parser.add_argument("--gen-tokens", type=int, default=32)
    parser.add_argument("--gen-prompts", type=int, default=3, help="0: no timed generations")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: on a shared, loaded machine more threads wait on each other)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)

    conn = psycopg.connect(owner_url(), autocommit=True)
    record = load_atom_set(conn, args.atom_set)
    exact_model = ExactModel.load("smollm2", "cpu")
    tokenizer = exact_model.tokenizer
    if args.text:
        text, source = Path(args.text).read_text(encoding="utf-8"), args.text
    else:
        text, source = recorded_halves(record.stats).test, f"{args.atom_set} test half"
    ids = list(tokenizer.encode(text))[:args.positions + 1]

    t0 = time.perf_counter()
    forced = teacher_force(exact_model.model, [np.asarray(ids)])
    exact_argmax = forced.argmax[0][:-1]
    teacher_s = time.perf_counter() - t0
    pos = per_position(conn, args.atom_set, ids, record.vocab_size)
    right = pos["top"] == exact_argmax
    wrong = ~right
    auc = risk_auc(wrong, pos["risk"])
    rows = curve(pos["risk"], right)
    predicted_gap = np.array([np.nan if s["predicted_gap"] is None else s["predicted_gap"] for s in pos["signals"]])
    gap = gap_quality(pos["gap"], predicted_gap, wrong)

    spatial = SpatialBackend(conn, args.atom_set, tokenizer=tokenizer)
    exact = ExactBackend(exact_model)
    prompts = [ids[i * 64:(i + 1) * 64] for i in range(args.gen_prompts)]
    for row in rows if args.gen_prompts > 0 else []:
        f = row["fraction_exact"]
        row["hybrid_generation"] = timed_generation(Engine(HybridBackend(spatial, exact, row["threshold"])),
                                                    prompts, args.gen_tokens)
        row["random_generation"] = timed_generation(Engine(RandomRouter(spatial, exact, f)), prompts,
                                                    args.gen_tokens)
        print(json.dumps(row), flush=True)

    out = {"command": "benchmarks/risk_hybrid.py " + " ".join(
               f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
           "atom_set": args.atom_set, "text": source, "positions": len(exact_argmax),
           "risk_model": record.risk_model.model_dump() if record.risk_model else None,
           "spatial_top1_agreement": float(right.mean()), "roc_auc_wrong": auc, "calibration_gap": gap,
           "next_token_ms_median": pos["next_token_ms"], "signals_ms_median": pos["signals_ms"],
           "teacher_seconds": teacher_s, "curve": rows,
           "exact_ms_per_token": rows[-1].get("hybrid_generation", {}).get("ms_per_token"),
           "spatial_ms_per_token": rows[0].get("hybrid_generation", {}).get("ms_per_token"),
           "machine": {"cpus": os.cpu_count(), "load_1min": os.getloadavg()[0], "gpu": None,
                       "note": "2 vCPUs shared with other helpers' tests and builds"},
           "per_position": [{"exact": int(e), "spatial": int(s), "actual_gap": None if math.isnan(g) else float(g),
                             **sig} for e, s, g, sig in zip(exact_argmax, pos["top"], pos["gap"], pos["signals"])]}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({k: v for k, v in out.items() if k not in ("curve", "per_position", "risk_model")}, indent=1))


if __name__ == "__main__":
    main()
