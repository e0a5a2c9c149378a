"""Research: which cheap extra per-step signals would raise the risk predictor's ROC AUC (issue 16)?

Two stages, so the slow part runs once:

    gather   for one text: the exact argmax after every prefix (teacher forcing), the spatial
             path's candidate atoms of every prefix (the same ones next_token and
             next_token_signals score: the 100 nearest stored atoms by ht_knn and the context's
             history atoms), SQL next_token_signals (the 8 current features) and next_token's
             greedy top-1, stored as JSON lines;
    analyse  fits logistic regressions (standardised, C = 1, as projection/risk.py) on the
             calibration half's positions and scores ROC AUC of "spatial top-1 != exact top-1"
             on the other texts: the current 8 features, current + each candidate, and current +
             a combination chosen by forward selection on 5-fold cross-validated AUC within the
             calibration half (the scoring texts never choose anything).

Every candidate is computed here in NumPy from the candidate rows, from the context and from
tokens.text, i.e. from what next_token already has; the definitions are in `candidate_features`.
Three of them were adopted (hartonomous/signals.py, sql/050_signals.sql: the top token's nearest
candidate, stored votes and nearest history atom); `SIGNAL_FEATURES` here stays the 8 signals the
table in docs/results/2026-11-24-risk-features.md calls "current", so the script re-runs that
measurement as it was made (commit c78d588).

    PYTHONPATH=$PWD .venv/bin/python benchmarks/risk_features.py gather --split calibration --out cal.jsonl
    PYTHONPATH=$PWD .venv/bin/python benchmarks/risk_features.py gather --text FILE --out gpl.jsonl
    PYTHONPATH=$PWD .venv/bin/python benchmarks/risk_features.py analyse --fit cal.jsonl \\
        --score test=test.jsonl gpl3=gpl.jsonl apt=apt.jsonl [--combo a,b c,d] --out result.json
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np

SIGNAL_FEATURES = ("h", "h2", "varentropy", "r", "top_probability", "nearest_bandwidths", "history_share",
                   "distinct_tokens")

# The candidate rows next_token scores, with the history atoms' keys unpacked: kind 0 = stored
# atom (token, weight, distance), kind 1 = history atom k (its token is context[n - m + k], 1-based).
CANDIDATES_SQL = """
WITH s AS MATERIALIZED (SELECT * FROM ht_atom_set(%(atom_set)s::text)),
     c AS MATERIALIZED (SELECT cc.center, cc.history_keys
                          FROM s, LATERAL ht_context_centroid(s.id, s.centroid_window, s.centroid_decay,
                                                              %(context)s::integer[], s.history_window) cc)
SELECT 0, k.token_id, k.weight, k.distance, 0 FROM s, c, LATERAL ht_knn(s.id, c.center, 100) k
UNION ALL
SELECT 1, NULL, s.history_weight, h.key <<->> c.center, h.k::integer
  FROM s, c, LATERAL unnest(CASE WHEN s.history_weight > 0 THEN c.history_keys END) WITH ORDINALITY h(key, k)
"""


# ----------------------------------------------------------------------------------------- gather

def gather(args) -> None:
    import psycopg
    import torch

    from hartonomous import sqlcalls
    from hartonomous.atomset import load_atom_set
    from hartonomous.db.connection import owner_url
    from hartonomous.runtimes.reference import ExactModel
    from hartonomous.generation_config import SamplerArgs
    from hartonomous.splits import recorded_halves
    from hartonomous.corpus.teacher import teacher_force

    torch.set_num_threads(1)
    conn = psycopg.connect(owner_url(), autocommit=True)
    record = load_atom_set(conn, args.atom_set)
    set_id, kernel, bandwidth = record.id, record.kernel, record.bandwidth
    exact_model = ExactModel.load("smollm2", "cpu")
    if args.text:
        text = Path(args.text).read_text(encoding="utf-8")
    else:
        text = getattr(recorded_halves(record.stats), args.split)
    ids = list(exact_model.tokenizer.encode(text))[:args.positions + 1]
    exact_argmax = teacher_force(exact_model.model, [np.asarray(ids)]).argmax[0][:-1]
    texts = dict(conn.execute("SELECT token_id, text FROM tokens WHERE atom_set_id = %s", (set_id,)).fetchall())
    greedy = SamplerArgs(0.0, None, 1.0, 1.0)
    t0 = time.perf_counter()
    with open(args.out, "w") as fh:
        for t in range(1, len(ids)):
            context = ids[:t]
            rows = conn.execute(CANDIDATES_SQL, {"atom_set": args.atom_set, "context": context},
                                prepare=True).fetchall()
            n = len(context)
            m = sum(1 for r in rows if r[0] == 1)
            cand = [[int(r[0]), int(r[1]) if r[0] == 0 else int(context[n - m + r[4] - 1]), float(r[2]),
                     float(r[3])] for r in rows]
            top_rows = sqlcalls.next_token(conn, context, greedy, atom_set=args.atom_set)
            signals = sqlcalls.next_token_signals(conn, context, atom_set=args.atom_set)
            fh.write(json.dumps({"t": t, "context": context, "exact": int(exact_argmax[t - 1]),
                                 "spatial": top_rows[0][0] if top_rows else -1, "signals": signals.as_dict(),
                                 "candidates": cand, "kernel": kernel, "bandwidth": bandwidth}) + "\n")
            if t % 100 == 0:
                print(f"{t}/{len(ids) - 1} {time.perf_counter() - t0:.0f}s", flush=True)
    Path(args.out + ".tokens.json").write_text(json.dumps(texts))


# ---------------------------------------------------------------------------------------- features

def kernel_rows(cand: np.ndarray, kernel: str, bandwidth: float):
    """Per candidate: kind, token, weight, distance and its share of the kernel mass (next_token's softmax)."""
    kind, tok, w, d = cand[:, 0].astype(int), cand[:, 1].astype(int), cand[:, 2], cand[:, 3]
    u = d / bandwidth
    lc = np.log(w) - (u * u if kernel == "gaussian" else u)
    e = np.exp(lc - lc.max())
    e[lc - lc.max() < -700] = 0.0
    return kind, tok, w, d, e


def candidate_features(rec: dict, texts: dict[str, str]) -> dict[str, float]:
    """Every candidate signal of one step. Notation: p = the kernel distribution over tokens at T = 1
    (no top-k/top-p/penalty; ties broken by the lowest token id, as next_token), p1 >= p2 its two
    largest probabilities, `top` the spatial top-1 token, h the bandwidth, e_i = w_i K(d_i) each
    candidate atom's kernel mass, 'stored' the ht_knn neighbours, 'history' the history atoms."""
    cand = np.asarray(rec["candidates"], dtype=float)
    h = rec["bandwidth"]
    kind, tok, w, d, e = kernel_rows(cand, rec["kernel"], h)
    u = d / h
    lc_max = float(np.max(np.log(w) - (u * u if rec["kernel"] == "gaussian" else u)))
    unique, inverse = np.unique(tok, return_inverse=True)
    mass = np.bincount(inverse, weights=e, minlength=len(unique))
    p = mass / mass.sum()
    order = np.argsort(-p, kind="stable")           # unique is ascending: stable sort keeps lowest id first
    i1 = order[0]
    top = int(unique[i1])
    p1 = float(p[i1])
    p2 = float(p[order[1]]) if len(p) > 1 else 0.0
    is_top = tok == top
    hist = kind == 1
    context = rec["context"]
    n = len(context)
    hist_tokens = tok[hist]
    stored_d = d[~hist]
    out = {
        # margin and odds of the top two tokens
        "top_margin": p1 - p2,
        "log_top_ratio": math.log(p1) - math.log(max(p2, 1e-20)),   # ln(p1/p2), p2 floored at 1e-20
        "p2": p2,
        # how the top token is supported
        "top_history_share": float(e[is_top & hist].sum() / e[is_top].sum()),
        "top_in_history": float(np.any(hist_tokens == top)),        # top is among the history atoms' tokens
        "top_in_last20": float(top in context[-20:]),
        "ln_top_count_history": math.log1p(int(np.sum(hist_tokens == top))),
        "ln_top_votes": math.log(int(is_top.sum())),                # atoms (stored + history) voting for top
        "ln_top_stored_votes": math.log1p(int(np.sum(is_top & ~hist))),
        "top_nearest_bandwidths": float(d[is_top].min() / h),       # nearest atom of top, in bandwidths
        "top_nearest_gap": float(d[is_top].min() / h - d.min() / h),  # how much nearer some other atom is
        "top_is_last": float(top == context[-1]),                   # spatial predicts a repetition
        "top_stored_nearest_bandwidths": float(d[is_top & ~hist].min() / h) if np.any(is_top & ~hist)
                                          else float(stored_d.max() / h),  # none among the KNN: the 100th's
        "ln_top_nearest_bandwidths": math.log(float(d[is_top].min() / h) + 0.01),
        # copying: the nearest history atom (the same recent context seen before in this text)
        "ln_history_nearest_bandwidths": math.log(min(float(d[hist].min() / h), 10.0) + 0.01) if hist.any()
                                         else math.log(10.01),          # capped at 10 bandwidths; none: 10
        "history_nearest_is_top": float(hist.any() and int(tok[hist][np.argmin(d[hist])]) == top),
        "ln_top_history_nearest_bandwidths": math.log(min(float(d[is_top & hist].min() / h), 10.0) + 0.01)
                                             if np.any(is_top & hist) else math.log(10.01),
        # absolute kernel mass (a density estimate at the centroid, not normalised): ln sum w K(d)
        "ln_kde": float(lc_max + math.log(e.sum())),
        "ln_top_kde": float(lc_max + math.log(e[is_top].sum())),
        # context
        "ln_n": math.log(n),
        "step_bandwidths": (float(d[hist][-1] / h) if hist.any() else 0.0),  # centroid move since the previous prefix
        # geometry of the neighbourhood
        "knn_far_bandwidths": float(stored_d.max() / h) if len(stored_d) else 0.0,  # 100th neighbour
        "ln_eff_atoms": float(-(np.where(e > 0, (e / e.sum()) * np.log(np.maximum(e / e.sum(), 1e-300)), 0)).sum()),
        # stored vs history views
        "stored_history_agree": 0.0, "stored_top_is_top": 0.0, "stored_p1": 0.0,
        # token text (tokens.text): one bit per token
        "top_word_start": float(texts.get(str(top), "").startswith(" ")),
        "last_word_start": float(texts.get(str(context[-1]), "").startswith(" ")),
        "top_alpha": float(texts.get(str(top), "").strip().isalpha()),
        "top_newline": float("\n" in texts.get(str(top), "")),
        "last_alpha": float(texts.get(str(context[-1]), "").strip().isalpha()),
    }
    sm = np.bincount(inverse[~hist], weights=e[~hist], minlength=len(unique))
    hm = np.bincount(inverse[hist], weights=e[hist], minlength=len(unique))
    if sm.sum() > 0:
        s_top = int(np.argmax(sm))
        out["stored_top_is_top"] = float(s_top == i1)
        out["stored_p1"] = float(sm.max() / sm.sum())
        if hm.sum() > 0:
            out["stored_history_agree"] = float(s_top == int(np.argmax(hm)))
    return out


def load(path: str) -> dict:
    texts = json.loads(Path(path + ".tokens.json").read_text())
    recs = [json.loads(line) for line in open(path)]
    base = np.array([[r["signals"][k] for k in SIGNAL_FEATURES] for r in recs], dtype=float)
    cands = [candidate_features(r, texts) for r in recs]
    names = list(cands[0])
    extra = np.array([[c[k] for k in names] for c in cands], dtype=float)
    spatial = np.array([r["spatial"] for r in recs])
    exact = np.array([r["exact"] for r in recs])
    last = np.array([r["context"][-1] for r in recs])
    # check: our reconstruction of the candidates gives next_token's top-1 and next_token_signals' values
    mine_top = []
    mine_sig = []
    from hartonomous.signals import candidate_signals
    for r in recs:
        cand = np.asarray(r["candidates"], dtype=float)
        kind, tok, w, d, e = kernel_rows(cand, r["kernel"], r["bandwidth"])
        unique, inverse = np.unique(tok, return_inverse=True)
        mass = np.bincount(inverse, weights=e)
        mine_top.append(int(unique[int(np.argmax(mass))]))
        s = candidate_signals(tok, d, w, kind == 1, r["kernel"], r["bandwidth"], float(d[kind == 0].min()))
        mine_sig.append([s.features()[k] for k in SIGNAL_FEATURES])
    check = {"top1_mismatches": int(np.sum(np.array(mine_top) != spatial)),
             "signals_max_abs_diff": float(np.nanmax(np.abs(np.array(mine_sig, dtype=float) - base)))}
    return {"base": base, "extra": extra, "names": names, "wrong": (spatial != exact).astype(int),
            "spatial": spatial, "last": last, "check": check, "risk_sql": np.array(
                [np.nan if r["signals"]["risk"] is None else r["signals"]["risk"] for r in recs])}


def prior_table(keys: np.ndarray, wrong: np.ndarray, strength: float = 10.0):
    """Per key: (wrong_count + strength x base rate) / (count + strength); unseen keys: the base rate."""
    base = float(wrong.mean())
    table = {}
    for k in np.unique(keys):
        sel = keys == k
        table[int(k)] = (float(wrong[sel].sum()) + strength * base) / (float(sel.sum()) + strength)
    return lambda ks: np.array([table.get(int(k), base) for k in ks])


# ---------------------------------------------------------------------------------------- analyse

def fit(x: np.ndarray, y: np.ndarray):
    from sklearn.linear_model import LogisticRegression

    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    model = LogisticRegression(C=1.0, max_iter=2000).fit((x - mean) / scale, y)
    return lambda z: model.decision_function((z - mean) / scale)


def cv_auc(x: np.ndarray, y: np.ndarray, folds: int = 5) -> float:
    """Mean AUC over contiguous folds (positions are sequential: contiguous blocks avoid leakage)."""
    from sklearn.metrics import roc_auc_score

    edges = np.linspace(0, len(y), folds + 1).astype(int)
    aucs = []
    for a, b in zip(edges[:-1], edges[1:]):
        test = np.zeros(len(y), dtype=bool)
        test[a:b] = True
        if len(np.unique(y[test])) < 2:
            continue
        aucs.append(roc_auc_score(y[test], fit(x[~test], y[~test])(x[test])))
    return float(np.mean(aucs))


def analyse(args) -> None:
    from sklearn.metrics import roc_auc_score

    cal = load(args.fit)
    scores = {}
    for item in args.score:
        name, path = item.split("=", 1)
        scores[name] = load(path)
    names = cal["names"]
    priors = {"prior_top": prior_table(cal["spatial"], cal["wrong"]),
              "prior_last": prior_table(cal["last"], cal["wrong"])}

    def matrix(data: dict, feats: list[str]) -> np.ndarray:
        cols = [data["base"]]
        for f in feats:
            if f in priors:
                key = data["spatial"] if f == "prior_top" else data["last"]
                # on the calibration half itself a prior is out-of-fold (5 contiguous folds), else it is its own label
                if data is cal:
                    col = np.empty(len(key))
                    edges = np.linspace(0, len(key), 6).astype(int)
                    for a, b in zip(edges[:-1], edges[1:]):
                        inside = np.zeros(len(key), dtype=bool)
                        inside[a:b] = True
                        col[inside] = prior_table(key[~inside], cal["wrong"][~inside])(key[inside])
                    cols.append(col[:, None])
                else:
                    cols.append(priors[f](key)[:, None])
            else:
                cols.append(data["extra"][:, [names.index(f)]])
        return np.hstack(cols)

    def row(feats: list[str]) -> dict:
        x = matrix(cal, feats)
        score = fit(x, cal["wrong"])
        out = {"features": "current" + "".join(f" + {f}" for f in feats), "cal_cv_auc": cv_auc(x, cal["wrong"])}
        for name, data in scores.items():
            out[name] = float(roc_auc_score(data["wrong"], score(matrix(data, feats))))
            out[name + "_first500"] = float(roc_auc_score(data["wrong"][:500], score(matrix(data, feats))[:500]))
        return out

    candidates = names + list(priors)
    result = {"fit": args.fit, "positions": {"calibration": len(cal["wrong"]),
                                             **{k: len(v["wrong"]) for k, v in scores.items()}},
              "wrong_rate": {"calibration": float(cal["wrong"].mean()),
                             **{k: float(v["wrong"].mean()) for k, v in scores.items()}},
              "checks": {"calibration": cal["check"], **{k: v["check"] for k, v in scores.items()}},
              "stored_model_auc": {k: float(roc_auc_score(v["wrong"][:500], v["risk_sql"][:500]))
                                   for k, v in scores.items()}}
    # univariate AUC (sign as is: > 0.5 means higher value, more often wrong)
    uni = {}
    for f in list(SIGNAL_FEATURES) + names:
        uni[f] = {}
        for name, data in [("calibration", cal), *scores.items()]:
            col = data["base"][:, SIGNAL_FEATURES.index(f)] if f in SIGNAL_FEATURES else data["extra"][:, names.index(f)]
            uni[f][name] = float(roc_auc_score(data["wrong"], col)) if np.ptp(col) > 0 else 0.5
    result["univariate_auc"] = uni
    rows = [row([])] + [row([f]) for f in candidates]
    # forward selection on the calibration half's cross-validated AUC only (the priors excluded: lookup tables)
    chosen, best = [], rows[0]["cal_cv_auc"]
    while True:
        trials = [(cv_auc(matrix(cal, chosen + [f]), cal["wrong"]), f) for f in names if f not in chosen]
        auc, f = max(trials)
        if auc < best + 0.002:
            break
        chosen.append(f)
        best = auc
        rows.append(row(list(chosen)))
    result["forward_selected"] = chosen
    result["table"] = rows
    result["with_prior_top"] = row(chosen + ["prior_top"])
    # combinations picked after looking at the single-feature rows (post hoc: flagged as such)
    result["post_hoc"] = [row(list(c)) for c in args.combo]
    rows += result["post_hoc"]
    # paired bootstrap of the AUC gain over the current features, per scoring text
    rng = np.random.default_rng(0)
    boot = {}
    for c in [chosen, *args.combo]:
        base_fit = fit(matrix(cal, []), cal["wrong"])
        new_fit = fit(matrix(cal, list(c)), cal["wrong"])
        key = " + ".join(c)
        boot[key] = {}
        for name, data in scores.items():
            y, r0, r1 = data["wrong"], base_fit(matrix(data, [])), new_fit(matrix(data, list(c)))
            gains = []
            for _ in range(500):
                i = rng.integers(0, len(y), len(y))
                if len(np.unique(y[i])) == 2:
                    gains.append(roc_auc_score(y[i], r1[i]) - roc_auc_score(y[i], r0[i]))
            boot[key][name] = [float(np.percentile(gains, 2.5)), float(np.percentile(gains, 97.5))]
    result["bootstrap_gain_95"] = boot
    Path(args.out).write_text(json.dumps(result, indent=1))
    cols = ["cal_cv_auc", *scores]
    print("| features | " + " | ".join(cols) + " |")
    for r in rows + [result["with_prior_top"]]:
        print(f"| {r['features']} | " + " | ".join(f"{r[c]:.3f}" for c in cols) + " |")
    print(json.dumps({k: result[k] for k in ("positions", "wrong_rate", "checks", "stored_model_auc",
                                             "forward_selected", "bootstrap_gain_95")}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gather")
    g.add_argument("--atom-set", default="ctx20")
    g.add_argument("--split", choices=("calibration", "test"), default="test")
    g.add_argument("--text", default=None)
    g.add_argument("--positions", type=int, default=1500)
    g.add_argument("--out", required=True)
    a = sub.add_parser("analyse")
    a.add_argument("--fit", required=True)
    a.add_argument("--score", nargs="+", required=True, help="name=path.jsonl")
    a.add_argument("--combo", nargs="*", default=[], type=lambda v: v.split(","),
                   help="extra feature combinations to score, comma-separated (post hoc)")
    a.add_argument("--out", required=True)
    args = parser.parse_args()
    gather(args) if args.cmd == "gather" else analyse(args)


if __name__ == "__main__":
    main()
