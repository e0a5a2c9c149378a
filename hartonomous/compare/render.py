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

SECTIONS = ("Headline", "1. Teacher-forced fidelity", "2. Free generation", "3. Baselines", "4. Claims",
            "Machine", "How to read this")


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


def _dist_row(name: str, d: dict) -> list[str]:
    return [name, f(d["mean"]), f(d["median"]), f(d["p05"]), f(d["p95"]), str(d["n"]), str(d["undefined"])]


DIST_HEADERS = ("metric", "mean", "median", "p5", "p95", "n", "undefined")
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
    out.append(Block("p", f"Evaluation text: {texts}. {split_sentence(report)}"))

    out.append(Block("h2", "Headline"))
    out.append(Block("table", headers=HEADLINE_HEADERS, rows=tuple(headline_cells(report, r)
                                                                  for r in report["headline"])))
    out.append(Block("p", control_sentence(report)))

    out += _fidelity(fid, s)
    out += _generation(report["generation"], report["machine"])
    out += _baselines(report["baselines"], fid)
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
        f"of its candidate distribution, NLL smoothed). The best baseline is the baseline path with the highest "
        f"top-1 agreement, the 4-gram + cache included. docs/compare.md has the details.")))
    return out


HEADLINE_HEADERS = ("metric", "spatial", "exact", "best baseline", "spatial, random positions", "claimed")


def headline_cells(report: dict, r: dict) -> list[str]:
    """One headline row as text (the same cells in report.md, report.html and the terminal)."""
    return [r["metric"], f(r["spatial"]), f(r["exact"]),
            f"{f(r['baseline'])} ({r['baseline_name']})" if r["baseline_name"] else "—",
            _control_cell(report, r), f(r["claimed"]) if r["claimed"] is not None else "—"]


def _control(report: dict) -> dict:
    return (report["fidelity"].get("controls") or {}).get("random_positions") or {}


def _control_cell(report: dict, r: dict) -> str:
    if "random_positions" not in r:
        return "—"
    control = _control(report)
    return f(r["random_positions"]) if control.get("status") == "scored" else control.get("status", "n/a")


def control_sentence(report: dict) -> str:
    """What the random-positions control is, or why it is not there."""
    control = _control(report)
    if not control:
        return "Random-positions control: not in this report (schema 1.1)."
    if control["status"] == "scored":
        return f"Spatial, random positions (atom set '{control['atom_set']}'): {control['note']}."
    return f"Random-positions control: {control['note']}."


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
           Block("p", f"{fid['positions']} positions. Perplexity of the text: exact {f(ex['perplexity'])}, "
                      f"spatial {f(sp['perplexity'])} (smoothed, ε = {s['smoothing_epsilon']:g}); the actual next "
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
    return [name, f(p["top1"]["mean"]), f(p["top10_overlap"]["mean"]), f(p["mass_covered"]["mean"]),
            f(p["js"]["mean"]), f(p["pearson"]["mean"]), f(p["perplexity"]), f(p["target_in_support"]["mean"])]


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


# --- renderers -------------------------------------------------------------------------

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.6em 0 1.2em}td,th{border:1px solid #ccc;padding:3px 8px;vertical-align:top}
th{background:#f3f3f3;text-align:left}td{white-space:pre-wrap}figure{display:inline-block;margin:.3em}
figcaption{font-size:.85em;color:#555;max-width:640px}h2{border-bottom:1px solid #ddd;padding-bottom:.2em}"""


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
