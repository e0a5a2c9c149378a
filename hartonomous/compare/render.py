"""report.html, report.md and report.json from the report dict: one list of blocks, two renderers.

The HTML is self-contained (figures are base64 PNGs, CSS inline); report.md links the same
figures written as PNG files under figures/.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass
from pathlib import Path

from hartonomous.compare.schema import validate_report

SECTIONS = ("Headline", "1. Teacher-forced fidelity", "2. Free generation", "3. Baselines", "Risk and hybrid routing",
            "Against the real text", "4. Claims", "Machine", "How to read this")


@dataclass
class Block:
    kind: str          # h1 | h2 | h3 | p | table | figure | pre
    text: str = ""
    headers: tuple = ()
    rows: tuple = ()
    name: str = ""


def f(value, digits: int = 3) -> str:
    """A number for a table: 3 significant digits, n/a for None."""
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, list):
        return ", ".join(f(v, digits) for v in value)
    return str(value)


def interval(value, ci95: list[float] | None) -> str:
    """A mean with its 95 % interval, "0.298 [0.27, 0.32]"; the mean alone where there is no interval.
    The ends get 2 significant digits, more where 2 would print them equal."""
    if value is None or not ci95:
        return f(value)
    low, high = ci95
    digits = 2
    while digits < 6 and low != high and _end(low, digits) == _end(high, digits):
        digits += 1
    return f"{f(value)} [{_end(low, digits)}, {_end(high, digits)}]"


def _end(x: float, digits: int) -> str:
    """An interval's end: `digits` significant digits, whole numbers rather than 3.1e+02 below 10^6."""
    text = f"{x:.{digits}g}"
    return f"{x:.0f}" if "e+" in text and abs(x) < 1e6 else text


def _dist_row(name: str, d: dict) -> list[str]:
    return [name, interval(d["mean"], d.get("ci95")), f(d["median"]), f(d["p05"]), f(d["p95"]), str(d["n"]),
            str(d["undefined"])]


DIST_HEADERS = ("metric", "mean [95 %]", "median", "p5", "p95", "n", "undefined")
PATH_LABELS = {
    "top1": "top-1 agreement", "top10_overlap": "top-10 overlap", "mass_covered": "exact mass covered",
    "exact_p_of_argmax": "exact p of its argmax", "js": "JS divergence (nats)",
    "pearson": "Pearson, union of supports", "pearson_full_vocab": "Pearson, full vocabulary",
    "nll": "NLL of the text (smoothed)", "target_in_support": "actual next token among candidates",
    "candidates": "candidate tokens",
}


def blocks(report: dict) -> list[Block]:
    """The report's content, in order, independent of the output format."""
    a, fid, s = report["atom_set"], report["fidelity"], report["settings"]
    out = [Block("h1", f"Spatial vs exact inference — atom set '{a['name']}'")]
    out.append(Block("p", f"Model {a['model']}; {a['kind']} atoms: {a['atoms']:,}; projection {a['projection']}; "
                          f"centroid window {a['centroid_window'] or 'all tokens'}, decay {a['centroid_decay']:g}; "
                          f"kernel {a['kernel']} (h = {a['bandwidth']:g}); K = {s['max_neighbors']} neighbours. "
                          f"Generated {report['generated_at']}."))
    if report["machine"].get("exact_model"):
        out.append(Block("p", f"Exact path: {report['machine']['exact_model']}."))
    texts = "; ".join(f"{t['source']} ({'held out' if t['held_out'] else 'user text'}, {t['positions']} positions "
                      f"of {t['tokens']} tokens)" for t in report["texts"])
    out.append(Block("p", f"Evaluation text: {texts}. {split_sentence(report)}{memory_sentence(report)}"))

    out.append(Block("h2", "Headline"))
    out.append(Block("table", headers=headline_headers(report), rows=tuple(headline_cells(report, r)
                                                                          for r in report["headline"])))
    out.append(Block("p", interval_sentence(report)))
    out.append(Block("p", control_sentence(report)))
    out += _comparisons(report)

    out += _fidelity(fid, s)
    out += _generation(report["generation"], report["machine"])
    out += _baselines(report["baselines"], fid)
    out += routing_blocks(report.get("routing"))
    out += real_text_blocks(report.get("real_text"))
    out += _claims(report)
    out.append(Block("h2", "How to read this"))
    out.append(Block("p", (
        f"At each position t the exact model's full next-token distribution (softmax at T = 1) is compared with "
        f"next_token(context, temperature => 1, top_k => 0, top_p => 1). Top-1 agreement: both argmaxes equal "
        f"(ties by lowest token id). Top-{s['top_k_overlap']} overlap: shared tokens of both top-{s['top_k_overlap']} "
        f"lists / {s['top_k_overlap']}. Exact mass covered: the exact probability of the spatial candidate set. "
        f"JS divergence in nats (0 = identical, ln 2 ≈ 0.693 = disjoint supports). Pearson (union of supports): "
        f"the correlation of the two probability vectors over the spatial candidates ∪ the exact top-"
        f"{s['pearson_nucleus']:g} nucleus, averaged over positions (undefined when the union has one token). "
        f"Spatial perplexity smooths p' = (1 − ε) p + ε / V with ε = {s['smoothing_epsilon']:g}. Entropy signals "
        f"(nats): H, H2 = −ln Σp², V = Var[−ln p], R = H2 − (H − V/2), calibration gap = NLL − H (spatial: H, H2, V "
        f"of its candidate distribution, NLL smoothed). The best baseline is chosen per metric among every baseline "
        f"path: the highest mean where higher is better, the lowest for JS divergence and perplexity; each row names "
        f"it. Numbers in brackets are 95 % intervals; each comparison is a paired test on the same positions, "
        f"\"ahead\" or \"behind\" when its interval of the difference excludes 0, else \"no difference at n = …\". "
        f"docs/compare.md has the details.")))
    return out


HEADLINE_HEADERS = ("metric", "spatial", "exact", "best baseline", "spatial, random positions", "claimed")
VERDICT_WORDS = {"ahead": "spatial ahead", "behind": "spatial behind", "no difference": "no difference"}


def _against(report: dict) -> dict | None:
    return report["fidelity"].get("against")


def headline_headers(report: dict) -> tuple[str, ...]:
    """HEADLINE_HEADERS, with a column for the --against set before "claimed" when there is one."""
    other = _against(report)
    return HEADLINE_HEADERS if not other else (*HEADLINE_HEADERS[:-1], other["name"], HEADLINE_HEADERS[-1])


def _compared(value, ci95, verdict: str | None, name: str | None = None) -> str:
    """A compared path's cell: its value and interval, then its name and the verdict of the paired test."""
    words = "; ".join(w for w in (name, VERDICT_WORDS.get(verdict or "")) if w)
    return interval(value, ci95) + (f" ({words})" if words else "")


def headline_cells(report: dict, r: dict) -> list[str]:
    """One headline row as text (the same cells in report.md, report.html and the terminal)."""
    verdicts = r.get("verdicts") or {}
    cells = [r["metric"], interval(r["spatial"], r.get("spatial_ci95")), interval(r["exact"], r.get("exact_ci95")),
             _compared(r["baseline"], r.get("baseline_ci95"), verdicts.get("baseline"), r["baseline_name"])
             if r["baseline_name"] else "—",
             _control_cell(report, r)]
    if _against(report):
        cells.append(_compared(r["against"], r.get("against_ci95"), verdicts.get("against"))
                     if "against" in r else "—")
    return cells + [f(r["claimed"]) if r["claimed"] is not None else "—"]


def _control(report: dict) -> dict:
    return (report["fidelity"].get("controls") or {}).get("random_positions") or {}


def _control_cell(report: dict, r: dict) -> str:
    if "random_positions" not in r:
        return "—"
    control = _control(report)
    if control.get("status") != "scored":
        return control.get("status", "n/a")
    return _compared(r["random_positions"], r.get("random_positions_ci95"),
                     (r.get("verdicts") or {}).get("random_positions"))


def interval_sentence(report: dict) -> str:
    """How the intervals were computed, over how many positions, and the note when n is small."""
    iv = report.get("intervals")
    if not iv:
        return "No intervals in this report (schema before 1.3)."
    text = (f"Brackets: 95 % intervals, {iv['method']}, over n = {iv['positions']} positions in {iv['blocks']} "
            f"blocks (seed {iv['seed']}). The medians of ms/token and of shared buffers carry a bootstrap interval "
            f"over whole generations and over calls: how stable they were in this run on this machine, not on another.")
    return text + (f" Note: {iv['note']}." if iv.get("note") else "")


def _comparisons(report: dict) -> list[Block]:
    """The paired tests behind the headline's verdicts, one row each, worded by the verdict."""
    from hartonomous.compare.comparisons import ROLE_WORDS

    rows = report.get("comparisons") or []
    if not rows:
        return []
    return [Block("h3", "Paired comparisons"),
            Block("table", headers=("metric", "spatial vs", "path", "paired test (difference spatial − other, 95 %)"),
                  rows=tuple([c["row"] + (" (on the NLL)" if c["metric"] == "nll" else ""), ROLE_WORDS[c["role"]],
                              c["b"], c["wording"]] for c in rows))]


def control_sentence(report: dict) -> str:
    """What the random-positions control is, or why it is not there."""
    control = _control(report)
    if not control:
        return "Random-positions control: not in this report (schema 1.1)."
    if control["status"] == "scored":
        return f"Spatial, random positions (atom set '{control['atom_set']}'): {control['note']}."
    return f"Random-positions control: {control['note']}."


def memory_sentence(report: dict) -> str:
    """Whether the spatial path read the set's memory of past generations (compare --memory)."""
    memory = report["settings"].get("memory")
    if not memory:
        return ""
    return (f" The spatial path read the atom set's memory of past generations too (--memory): "
            f"{memory['atoms']:,} atoms from {memory['generations']:,} generations when scoring began, so these "
            "numbers depend on what was remembered, not on the atom set alone.")


def split_sentence(report: dict) -> str:
    """Which half of the holdout was scored, and what was fitted on which."""
    split = report["settings"].get("split")
    if split is None:
        return ("User text: --split applies only to the atom set's held-out text; the cache mixture was fitted "
                "on the holdout's calibration half where the set records one.")
    if split == "test":
        return ("Scored split: test, the half of the holdout that nothing was tuned on (the build calibrates on "
                "the calibration half; so does the cache mixture below).")
    return (f"Scored split: {split}. It contains the calibration half that the build tuned the spatial path on and "
            "the cache mixture was fitted on, so the numbers are optimistic; the default --split test is not.")


def _fidelity(fid: dict, s: dict) -> list[Block]:
    sp, ex = fid["spatial"], fid["exact"]
    out = [Block("h2", "1. Teacher-forced fidelity"),
           Block("p", f"{fid['positions']} positions. Perplexity of the text: exact "
                      f"{interval(ex['perplexity'], ex.get('perplexity_ci95'))}, spatial "
                      f"{interval(sp['perplexity'], sp.get('perplexity_ci95'))} (smoothed, ε = "
                      f"{s['smoothing_epsilon']:g}); the actual next "
                      f"token was among the spatial candidates at {f(sp['target_in_support']['mean'])} of positions.")]
    out.append(Block("table", headers=DIST_HEADERS,
                     rows=tuple(_dist_row(PATH_LABELS[k], sp[k]) for k in PATH_LABELS)))
    control = (fid.get("controls") or {}).get("random_positions")
    if control is not None:
        out.append(Block("h3", "Control: spatial path with random token positions"))
        if control["status"] == "scored":
            out.append(Block("p", f"Atom set '{control['atom_set']}' (see the headline for what it controls for)."))
            out.append(Block("table", headers=PATH_HEADERS, rows=(_path_row("spatial (3D)", sp),
                                                                  _path_row("spatial, random positions",
                                                                            control["path"]))))
        else:
            out.append(Block("p", f"spatial, random positions: {control['note']}."))
    other = fid.get("against")
    if other:
        weight = "its own calibrated weight" if other["history_weight"] is None else f"{other['history_weight']:g}"
        out.append(Block("h3", f"Another atom set: '{other['atom_set']}'"))
        out.append(Block("p", f"compare --against {other['atom_set']}: that set's spatial path on the same positions "
                              f"(the same K; history atoms at {weight}); the paired comparisons are under the "
                              "headline."))
        out.append(Block("table", headers=PATH_HEADERS, rows=(_path_row("spatial (3D)", sp),
                                                              _path_row(other["name"], other["path"]))))
    out.append(Block("h3", "Entropy signals (nats)"))
    rows = []
    for key, label in (("H", "H"), ("H2", "H2 (Rényi-2)"), ("V", "V (varentropy)"), ("R", "R = H2 − (H − V/2)"),
                       ("calibration_gap", "calibration gap NLL − H")):
        e, p = ex["signals"][key], sp["signals"][key]
        rows.append([label, f(e["mean"]), f(e["median"]), f(p["mean"]), f(p["median"])])
    out.append(Block("table", headers=("signal", "exact mean", "exact median", "spatial mean", "spatial median"),
                     rows=tuple(rows)))
    for name in ("agreement_by_position", "js", "pearson", "mass_covered", "exact_p_of_argmax", "entropy",
                 "calibration_gap"):
        out.append(Block("figure", name=name))
    bins = fid["by_position"]["bins"]
    if bins:
        names = list(bins[0]["values"])
        out.append(Block("table", headers=("context length", "positions", *names), rows=tuple(
            [f"{b['from']}" + ("" if b["to"] == b["from"] else f"–{b['to'] if b['to'] else '…'}"), str(b["n"]),
             *[f(b["values"][n]) for n in names]] for b in bins)))
    return out


def _generation(gen: dict, machine: dict) -> list[Block]:
    from hartonomous.measure import load_warning

    out = [Block("h2", "2. Free generation")]
    if gen.get("skipped"):
        return out + [Block("p", "Skipped (--no-generation).")]
    out.append(Block("p", f"Up to {gen['max_new_tokens']} new tokens per prompt. Greedy: {gen['modes']['greedy']}. "
                          f"Sampled: {gen['modes']['sampled']}. Exact path on {gen['exact_device']}."
                          + load_warning(machine)))
    out.append(Block("table", headers=("path", "tokens", "p50 ms/token", "p95 ms/token", "tokens/s"), rows=tuple(
        [p, str(gen[p]["tokens"]), f(gen[p]["p50_ms"]), f(gen[p]["p95_ms"]), f(gen[p]["tokens_per_s"])]
        for p in ("spatial", "exact"))))
    for i, row in enumerate(gen["prompts"], 1):
        out.append(Block("h3", f"Prompt {i}: {row['prompt']!r}"))
        for mode in ("greedy", "sampled"):
            pair = row[mode]
            out.append(Block("table", headers=(mode, "spatial", "exact"), rows=(
                ["output", pair["spatial"]["text"], pair["exact"]["text"]],
                ["tokens / finish", f"{pair['spatial']['tokens']} / {pair['spatial']['finish_reason']}",
                 f"{pair['exact']['tokens']} / {pair['exact']['finish_reason']}"],
                ["p50 / p95 ms", f"{f(pair['spatial']['p50_ms'])} / {f(pair['spatial']['p95_ms'])}",
                 f"{f(pair['exact']['p50_ms'])} / {f(pair['exact']['p95_ms'])}"],
            )))
    return out


def _baselines(base: dict, fid: dict) -> list[Block]:
    out = [Block("h2", "3. Baselines")]
    out.append(Block("p", _distillation_sentence(base["distillation"])))
    for key in ("cache", "infinigram_cache"):
        if base.get(key) is not None:
            out.append(Block("p", _cache_sentence(base[key])))
    out.append(Block("p", f"Full-dimensional KNN: {base['knn_note']}."))
    rows = [_path_row("spatial (3D)", fid["spatial"])]
    rows += [_path_row(name, p) for name, p in base["paths"].items()]
    out.append(Block("table", headers=PATH_HEADERS, rows=tuple(rows)))
    return out


PATH_HEADERS = ("path", "top-1", "top-10 overlap", "exact mass covered", "JS (nats)", "Pearson (union)",
                "perplexity (smoothed)", "target in candidates")


def _distillation_sentence(d: dict) -> str:
    """Which labels the counting baselines learned, from which text (name and version, or files and sha256)."""
    if not d["available"]:
        return f"Counting baselines (n-grams, ∞-gram): {d['note']}."
    origin = d.get("origin") or {}
    where = {"builtin": lambda: f"the built-in corpus {origin.get('name')} ({origin.get('version')})",
             "files": lambda: "the files " + ", ".join(
                 f"{file['path']} (sha256 {(file['sha256'] or 'not recorded')[:12]})" for file in origin["files"]),
             "text copy": lambda: "the copy of the training text in the set's stats (a set built before 2026-11-25)",
             }.get(origin.get("kind"), lambda: d["source"])()
    return (f"Counting baselines (n-grams, ∞-gram, and each with the cache) learned from {d['source']}: {where}, "
            f"{d['tokens']:,} training tokens; {d['note']}.")


def _cache_sentence(cache: dict) -> str:
    base = cache.get("base", "4-gram")
    name, p_base = f"{base} + cache", f"p_{base}"
    if not cache["available"]:
        return f"{name}: {cache['note']}."
    n = cache["min_suffix"]
    text = (f"{name}: the {base} mixed with the in-context cache (the longest suffix of the "
            f"context that occurred earlier in it votes for the tokens that followed it there): "
            f"p = (1 − λ) {p_base} + λ p_cache when that suffix has at least {n} token{'s' if n != 1 else ''}, "
            f"with λ = {f(cache['lambda'])}; {cache['note']}.")
    if cache["lambda"] == 0:
        text += f" λ = 0: the cache did not help on the calibration half, so this path is the {base} alone."
    grid = {(g["lambda"], g["min_suffix"]): g for g in cache["grid"]}
    chosen, alone = grid.get((cache["lambda"], cache["min_suffix"])), grid.get((0.0, cache["min_suffix"]))
    if chosen and alone:
        text += (f" On the calibration half, top-1 agreement {f(chosen['top1'])} against {f(alone['top1'])} for "
                 f"the {base} alone.")
    return text


def _path_row(name: str, p: dict) -> list[str]:
    """One path's means with their 95 % intervals."""
    def cell(key: str) -> str:
        return interval(p[key]["mean"], p[key].get("ci95"))

    return [name, cell("top1"), cell("top10_overlap"), cell("mass_covered"), cell("js"), cell("pearson"),
            interval(p["perplexity"], p.get("perplexity_ci95")), cell("target_in_support")]


def _claims(report: dict) -> list[Block]:
    m, q = report["machine"], report["queries"]
    out = [Block("h2", "4. Claims"),
           Block("table", headers=("claim (original documents)", "claimed", "measured here", "verdict", "how"),
                 rows=tuple([c["claim"], f(c["claimed"]), f"{f(c['measured'])} {c['unit']}".strip(), c["verdict"],
                             c["how"]] for c in report["claims"])),
           Block("p", f"next_token in the database (EXPLAIN ANALYZE, {q['calls']} calls, K = {q['max_neighbors']}): "
                      f"p50 {f(q['next_token_exec_ms_p50'])} ms, p95 {f(q['next_token_exec_ms_p95'])} ms; "
                      f"shared buffers per call p50 {f(q['next_token_buffers_p50'])} (max "
                      f"{f(q['next_token_buffers_max'])}); KNN alone p50 {f(q['knn_buffers_p50'])} (max "
                      f"{f(q['knn_buffers_max'])})."),
           Block("h2", "Machine"),
           Block("table", headers=("what", "value"), rows=tuple(_machine_rows(m)))]
    return out


def _machine_rows(machine: dict) -> list[list[str]]:
    """One row per machine key; a nested dict (server_settings) gives one row per entry."""
    rows = []
    for key, value in machine.items():
        if isinstance(value, dict):
            rows += [[f"{key}.{k}", f(v)] for k, v in value.items()]
        else:
            rows.append([key, f(value)])
    return rows


def routing_blocks(routing: dict | None) -> list[Block]:
    """The risk predictor's ROC AUC and the hybrid routing curve (hartonomous.compare.routing)."""
    out = [Block("h2", "Risk and hybrid routing")]
    if routing is None:
        return out + [Block("p", "Not in this report (schema before 1.3).")]
    if not routing["available"]:
        return out + [Block("p", f"Not measured: {routing['note']}.")]
    auc, m, c = routing["roc_auc"], routing["risk_model"], routing["step_costs"]
    out.append(Block("p", (
        f"The atom set's risk predictor (logistic regression on {len(m['features'])} step signal"
        f"{'s' if len(m['features']) != 1 else ''}, fitted by the "
        f"build on {f(m['positions'])} calibration positions, in-sample ROC AUC {f(m['calibration_auc'])}) on the "
        f"{routing['positions']} scored positions, with the risk the hybrid path computes there "
        f"(next_token_signals): ROC AUC for \"spatial top-1 is wrong\" {f(auc['estimate'])} "
        f"[{f(auc['low'])}, {f(auc['high'])}] (95 %, {routing['interval_method']}); spatial top-1 "
        f"{f(routing['spatial_top1'])}."
        + (f" {routing['missing_risk']} positions had no risk (no candidates) and rank as risk 1."
           if routing["missing_risk"] else ""))))
    out.append(Block("p", (
        "Routing curve, teacher forced: the steps with risk at or above the threshold (the quantile of this "
        "text's risks giving the fraction) go to the exact model, which agrees by definition; the rest keep "
        f"the spatial top-1. Random routing: {routing['random_routing']}. Perfect: the wrong steps first, "
        "min(1, f + spatial top-1). The agreement's interval keeps the threshold fixed and resamples blocks; "
        "risk vs random is a paired test on the same positions.")))
    out.append(Block("table", headers=ROUTING_HEADERS, rows=tuple(_routing_row(r) for r in routing["curve"])))
    out.append(Block("p", (
        "ms/token from per-step costs measured in this run (median ms per call): spatial step "
        f"{f(c['spatial']['ms_p50'])} ({c['spatial']['how']}, n = {c['spatial']['n']}); routing signals "
        f"{f(c['signals']['ms_p50'])} ({c['signals']['how']}, n = {c['signals']['n']}); exact step "
        f"{f(c['exact']['ms_p50'])} ({c['exact']['how']}, n = {c['exact']['n']}). A risk-routed step pays the "
        "signals plus its path's step (threshold 0 and ∞ compute no risk: the pure paths); random and perfect "
        "routing pay no signals. After a run of spatial steps the hybrid path's next exact forward feeds those "
        "tokens too, which a one-token step does not count, so the hybrid times are a lower bound.")))
    return out


ROUTING_HEADERS = ("steps to exact", "threshold", "routed", "agreement, risk routing [95 %]", "random",
                   "perfect", "risk vs random", "ms/token, risk routing", "ms/token, random")


def _routing_row(r: dict) -> list[str]:
    a = r["agreement"]
    return [f"{r['fraction']:.0%}", "∞" if r["threshold"] is None else f(r["threshold"]), f(r["fraction_exact"]),
            f"{f(a['estimate'])} [{f(a['low'])}, {f(a['high'])}]", f(r["random_agreement"]),
            f(r["perfect_agreement"]), r["vs_random"]["wording"] if r["vs_random"] else "—",
            f(r["ms_per_token"]), f(r["random_ms_per_token"])]


# --- renderers -------------------------------------------------------------------------

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0 1.2em}td,th{border:1px solid #ccc;padding:3px 8px;vertical-align:top}
th{background:#f3f3f3;text-align:left}td{white-space:pre-wrap}figure{display:inline-block;margin:.3em}
figcaption{font-size:.85em;color:#555;max-width:640px}h2{border-bottom:1px solid #ddd;padding-bottom:.2em}"""


REAL_TEXT_HEADERS = ("path", "top-1 [95 %]", "perplexity [95 %]", "ECE [95 %]", "n")


def _interval_cell(i: dict) -> str:
    return interval(i["estimate"], [i["low"], i["high"]] if i.get("low") is not None else None)


def real_text_blocks(real: dict | None) -> list[Block]:
    """Every path against the real next token (hartonomous.compare.real_text)."""
    out = [Block("h2", "Against the real text")]
    if real is None:
        return out + [Block("p", "Not measured: the report predates this section (schema 1.7).")]
    rows = tuple([p["name"] + (" (smoothed)" if p["smoothed"] else ""), _interval_cell(p["top1"]),
                  _interval_cell(p["perplexity"]), _interval_cell(p["ece"]), str(p["top1"]["n"])]
                 for p in real["paths"].values())
    out.append(Block("p", (
        f"{real['positions']} scored positions, each path against the real next token: top-1 is its argmax being "
        f"that token, perplexity exp of the mean NLL, ECE the expected calibration error over {real['ece_bins']} "
        f"equal-width bins of its top probability; intervals: {real['interval_method']}. Spatial and counting alone "
        f"are sparse: their NLL is smoothed, p' = (1 − ε) p + ε / V with ε = {real['smoothing_epsilon']:g}; the "
        "mixtures need no smoothing." + (f" Note: {real['note']}." if real.get("note") else ""))))
    out.append(Block("table", headers=REAL_TEXT_HEADERS, rows=rows))
    aug, cnt = real["augmented"], real["counting_exact"]
    out.append(Block("p", f"Augmented: {aug['note']}" + (f"; mean λ {f(aug['mean_weight'])}." if aug["available"]
                                                          else ".")))
    out.append(Block("p", f"Counting ⊕ exact: {cnt['note']}" + (f"; mean λ {f(cnt['mean_weight'])}."
                                                                 if cnt["available"] else ".")))
    change = real.get("perplexity_change")
    if change is not None:
        out.append(Block("p", "Augmented's perplexity relative to exact: "
                              + interval(change["estimate"], [change["low"], change["high"]]
                                         if change["low"] is not None else None)
                              + " (ratio − 1; the interval from the paired NLL difference's)."))
    for test in real["comparisons"]:
        out.append(Block("p", f"{test['a']} vs {test['b']}, {test['metric']}: {test['wording']}."))
    return out


def to_html(report: dict, figures: dict[str, tuple[str, bytes]]) -> str:
    e = html.escape
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>{e(report['atom_set']['name'])}: spatial vs exact</title><style>{CSS}</style></head><body>"]
    for b in blocks(report):
        if b.kind in ("h1", "h2", "h3"):
            parts.append(f"<{b.kind}>{e(b.text)}</{b.kind}>")
        elif b.kind == "p":
            parts.append(f"<p>{e(b.text)}</p>")
        elif b.kind == "table":
            head = "".join(f"<th>{e(h)}</th>" for h in b.headers)
            body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in b.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        elif b.kind == "figure" and b.name in figures:
            caption, png = figures[b.name]
            data = base64.b64encode(png).decode("ascii")
            parts.append(f"<figure><img alt='{e(caption)}' src='data:image/png;base64,{data}'>"
                         f"<figcaption>{e(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _md_cell(value: str) -> str:
    return str(value).replace("|", "\\|").replace("\n", "⏎").replace("\r", "") or " "


def to_markdown(report: dict, figures: dict[str, tuple[str, bytes]], figure_dir: str = "figures") -> str:
    lines: list[str] = []
    for b in blocks(report):
        if b.kind == "h1":
            lines += [f"# {b.text}", ""]
        elif b.kind == "h2":
            lines += [f"## {b.text}", ""]
        elif b.kind == "h3":
            lines += [f"### {b.text}", ""]
        elif b.kind == "p":
            lines += [b.text, ""]
        elif b.kind == "table":
            lines.append("| " + " | ".join(_md_cell(h) for h in b.headers) + " |")
            lines.append("|" + "---|" * len(b.headers))
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in b.rows]
            lines.append("")
        elif b.kind == "figure" and b.name in figures:
            lines += [f"![{figures[b.name][0]}]({figure_dir}/{b.name}.png)", ""]
    return "\n".join(lines)


def write_report(report: dict, figures: dict[str, tuple[str, bytes]], out_dir: Path) -> dict[str, Path]:
    """Validate against the schema, then write report.json, report.md (+ figures/), report.html."""
    validate_report(report)
    out_dir = Path(out_dir)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    for name, (_, png) in figures.items():
        (out_dir / "figures" / f"{name}.png").write_bytes(png)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "html": out_dir / "report.html"}
    paths["json"].write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    paths["md"].write_text(to_markdown(report, figures), encoding="utf-8")
    paths["html"].write_text(to_html(report, figures), encoding="utf-8")
    return paths
