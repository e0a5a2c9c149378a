"""`hartonomous compare`: run every section against one atom set and assemble the report dict."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psycopg

from hartonomous.corpus import teacher
from hartonomous.compare import DEFAULT_MAX_POSITIONS, baselines, claims, controls, generation, intervals, metrics, plots
from hartonomous.compare import fidelity as fid_mod
from hartonomous.compare.against import Against, load_against
from hartonomous.compare.progress import NoProgress, Progress
from hartonomous.compare.comparisons import interval_section, paired_comparisons
from hartonomous.compare.real_text import real_text_section
from hartonomous.compare.routing import routing_section
from hartonomous.compare.spatial import spatial_distribution
from hartonomous.atomset import AtomSet, key_dimensions, load_atom_set, model_name_for
from hartonomous.compare.atomset import Text, calibration_text, holdout_text, read_prompts, read_texts
from hartonomous.errors import UserError
from hartonomous.measure import describe_machine, load_average
from hartonomous.splits import SPLITS

SCHEMA_VERSION = "1.7"


@dataclass
class CompareOptions:
    atom_set: str
    texts: list[Path] = field(default_factory=list)
    prompts: Path | None = None
    max_positions: int = DEFAULT_MAX_POSITIONS
    max_neighbors: int = 100
    max_new_tokens: int = 32
    seed: int = 0
    device: str = "cpu"
    generation: bool = True
    distill_tokens: int | None = None      # None: as many as the build used (stats['corpus'])
    query_samples: int = 30
    cache_dir: Path | None = None          # the teacher-label cache (hartonomous.corpus.teacher)
    command: str = ""
    split: str = "test"                    # which half of the holdout to score; ignored with `texts`
    history_weight: float | None = None    # spatial path's history atoms: None = the set's calibrated weight, 0 = off
    against: str | None = None             # a second atom set scored on the same positions (--against)
    memory: bool = False                   # the spatial path reads the set's memory of past generations too

    def validate(self) -> None:
        if self.max_positions < 1:
            raise UserError(f"--max-positions must be >= 1, got {self.max_positions}")
        if not 1 <= self.max_neighbors <= 100_000:
            raise UserError(f"--max-neighbors must be between 1 and 100000, got {self.max_neighbors}")
        if self.max_new_tokens < 1:
            raise UserError(f"--max-new-tokens must be >= 1, got {self.max_new_tokens}")
        if self.distill_tokens is not None and self.distill_tokens < 0:
            raise UserError(f"--distill-tokens must be >= 0, got {self.distill_tokens}")
        if self.history_weight is not None and not (math.isfinite(self.history_weight)
                                                    and self.history_weight >= 0):
            raise UserError(f"--history-weight must be a finite number >= 0 (0: no history atoms), "
                            f"got {self.history_weight}")
        if self.split not in SPLITS:
            raise UserError(f"--split must be one of test, calibration, all; got {self.split!r}")
        if self.against is not None and not self.against.strip():
            raise UserError("--against needs the name of an atom set (see `hartonomous atom-sets`)")


def atom_set_summary(info: AtomSet, key_dim: int | None) -> dict:
    """The report's `atom_set` section: the record's columns, its keys and what "exact" means for its model."""
    from hartonomous.model import exact_model_description

    return {**info.summary(), "has_keys": key_dim is not None, "key_dim": key_dim,
            "exact_model": exact_model_description(info.model_key)}


def encode(tokenizer, text: str) -> list[int]:
    return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]


def budget(lengths: list[int], max_positions: int, limit: int) -> list[int]:
    """Tokens to keep per text: max_positions positions split evenly, each text within `limit` tokens.

    A text of n kept tokens gives n - 1 positions; 0 means the text is not used.
    """
    caps = [max(min(n, limit) - 1, 0) for n in lengths]
    alloc, left = [0] * len(caps), max_positions
    while left > 0:
        open_ = [i for i, cap in enumerate(caps) if alloc[i] < cap]
        if not open_:
            break
        share = max(1, left // len(open_))
        for i in open_:
            take = min(share, caps[i] - alloc[i], left)
            alloc[i] += take
            left -= take
            if left == 0:
                break
    return [a + 1 if a else 0 for a in alloc]


@dataclass
class CompareResult:
    report: dict                                   # JSON-able, hartonomous/schemas/report.schema.json
    figures: dict[str, tuple[str, bytes]]          # name -> (caption, PNG)


def run_compare(conn: psycopg.Connection, options: CompareOptions, *, model=None, tokenizer=None,
                model_name: str | None = None, progress: Progress | None = None,
                corpus_loader: baselines.CorpusLoader | None = None) -> CompareResult:
    """Run every section against one atom set; `render.write_report` turns the result into files.

    `corpus_loader(info) -> hartonomous.corpus.origin.TrainingText` recovers the set's training text for the
    counting baselines (default: baselines.recorded_corpus, from where the set records it came from);
    it raises CorpusUnavailable, with the reason the report gives, to skip them.
    """
    options.validate()
    load_start = load_average()
    progress = progress or NoProgress()
    info = load_atom_set(conn, options.atom_set)
    other = (load_against(conn, info, options.against, options.max_neighbors, options.history_weight,
                          scores_holdout=not options.texts)
             if options.against else None)
    texts = read_texts(options.texts) if options.texts else [holdout_text(info, options.split)]
    prompts = read_prompts(options.prompts) if options.prompts else default_prompts(texts)
    if model is None or tokenizer is None:
        from hartonomous.model import load_model, load_tokenizer

        model_name = model_name_for(info)
        progress.stage(f"loading {model_name}", 1)
        model, tokenizer = load_model(model_name, options.device), load_tokenizer(model_name)
        progress.advance()
    model_name = model_name or info.model_key or info.model
    vocab = int(model.config.vocab_size)
    if vocab < info.vocab_size:
        raise UserError(f"the model has {vocab} tokens but atom set '{info.name}' has {info.vocab_size}; "
                        "use the model the set was built from")

    # --- baselines' predictors -------------------------------------------------------
    predictors, distill, knn_note = _baselines(conn, info, model, model_name, tokenizer, options, progress,
                                               corpus_loader or baselines.recorded_corpus)

    # --- teacher-forced fidelity -------------------------------------------------------
    encoded = [encode(tokenizer, t.text) for t in texts]
    keep = budget([len(e) for e in encoded], options.max_positions, teacher.max_context(model))
    if sum(max(k - 1, 0) for k in keep) == 0:
        raise UserError("the evaluation text has fewer than 2 tokens; pass a longer --text")
    fid = fid_mod.Fidelity()
    total = sum(max(k - 1, 0) for k in keep)
    mixture = _cache_baseline(predictors, info, model, model_name, tokenizer, options, max(keep), vocab, progress)
    control = controls.random_positions(conn, info, options.max_neighbors, options.history_weight)
    scored = {controls.RANDOM_POSITIONS: control.predict} if control.predict else {}
    progress.stage("teacher-forced fidelity", total)
    memory = _memory_status(conn, info.name) if options.memory else None
    paths = {"spatial": lambda ctx: spatial_distribution(conn, ctx, info.name, options.max_neighbors,
                                                         options.history_weight, options.memory), **predictors,
             **scored, **({other.name: other.predict} if other else {})}
    kept = [(index, ids[:k]) for index, (ids, k) in enumerate(zip(encoded, keep)) if k >= 2]
    exact = teacher.teacher_force(model, [np.asarray(ids) for _, ids in kept], log_probs=True)
    for (index, ids), log_probs in zip(kept, exact.log_probs or []):
        fid_mod.evaluate_text(fid, index, ids, log_probs, paths, on_position=progress.advance)
    routing = routing_section(conn, info, fid, dict(kept), model, tokenizer, max_neighbors=options.max_neighbors,
                              history_weight=options.history_weight, progress=progress)
    forced = [(index, ids, log_probs) for (index, ids), log_probs in zip(kept, exact.log_probs or [])]
    real = real_text_section(conn, info, fid, forced, model, tokenizer, predictors, max_neighbors=options.max_neighbors,
                             history_weight=options.history_weight, memory=options.memory,
                             split=None if options.texts else options.split, chunk=max(keep), progress=progress)

    # --- queries: buffers and in-database time -----------------------------------------
    contexts = _sample_contexts(encoded, keep, options.query_samples)
    progress.stage("shared buffers per next_token call", 1)
    queries = claims.measure_queries(conn, info.name, info.id, contexts, options.max_neighbors)
    progress.advance()

    # --- free generation ---------------------------------------------------------------
    gen = None
    if options.generation:
        gen = _generation(conn, info, model, tokenizer, prompts, options, progress)

    machine = describe_machine(conn, str(next(model.parameters()).device), model_name)
    machine["load"] = {"start": load_start, "end": load_average()}
    report = _assemble(info, options, texts, encoded, keep, fid, distill, knn_note, predictors, queries, gen,
                       machine, atom_set_summary(info, key_dimensions(conn, info)), mixture, control, routing,
                       other, memory, real)
    return CompareResult(report, plots.all_figures(fid))


def default_prompts(texts: list[Text]) -> list[str]:
    """The first words of the evaluation text plus two general prompts."""
    words = texts[0].text.split()
    own = " ".join(words[:8]) if words else None
    return ([own] if own else []) + list(generation.DEFAULT_PROMPTS[:2])


def _baselines(conn, info, model, model_name, tokenizer, options, progress, corpus_loader):
    """The counting baselines (baselines.counting_baselines: the set's own text and labels) and KNN."""
    predictors, distill = baselines.counting_baselines(info, model, tokenizer, corpus_loader, options.distill_tokens,
                                                       options.cache_dir, progress)
    knn_note = "the atom set has no full-dimensional keys"
    key_dim = key_dimensions(conn, info)
    if key_dim is not None:
        emb = model.get_input_embeddings().weight.detach().float().cpu().numpy()
        if key_dim != emb.shape[1]:
            knn_note = (f"keys have {key_dim} dimensions, the embeddings {emb.shape[1]}; "
                        "full-dimensional KNN skipped")
        else:
            progress.stage("the set's full-dimensional keys (KNN baseline)", 1)
            predictors["knn"] = baselines.knn_predictor(conn, info, emb, options.max_neighbors)
            progress.advance()
            knn_note = (f"exact L2 KNN (pgvector's distances and order) over {info.atoms} atom keys, "
                        f"K = {options.max_neighbors}, "
                        "query = full-dimensional context centroid, Gaussian kernel with h = "
                        + ("stats.key_bandwidth" if info.stats.key_bandwidth else
                           "the median neighbour distance"))
    return predictors, distill, knn_note


def _cache_baseline(predictors, info, model, model_name, tokenizer, options, chunk, vocab,
                    progress) -> dict[str, baselines.CacheMixture]:
    """Add "4-gram + cache" and "∞-gram + cache" to `predictors`, each mixture fitted on the holdout's
    calibration half only (labelled once with the exact argmax); the sections by path."""
    sections = {path: baselines.CacheMixture(False, note=f"needs the {base}, which was skipped", base=base)
                for path, base in baselines.CACHE_BASES.items()}
    if not any(base in predictors for base in baselines.CACHE_BASES.values()):
        return sections
    calibration = calibration_text(info)
    labelled = None
    if calibration is not None:
        ids = encode(tokenizer, calibration.text)[:baselines.CALIBRATION_MAX_TOKENS]
        progress.stage("exact labels of the calibration half (cache mixtures)", len(ids))
        labels = teacher.argmax_labels(model, ids, chunk, progress=progress.advance, cache_dir=options.cache_dir)
        labelled = (ids, labels)
    for path, base in baselines.CACHE_BASES.items():
        if base not in predictors:
            continue
        progress.stage(f"fitting {path} on the calibration half", 1)
        predict, section = baselines.cache_mixture(predictors[base], labelled, chunk, vocab, base)
        progress.advance()
        if section.fitted_on and not options.texts and options.split != "test":
            section.note += (f"; the scored text ({options.split} split) contains that calibration half, so this "
                             "baseline's numbers are optimistic")
        predictors[path], sections[path] = predict, section
    return sections


def _sample_contexts(encoded, keep, n) -> list[list[int]]:
    pool = [ids[: t + 1] for ids, k in zip(encoded, keep) for t in range(max(k - 1, 0))]
    if not pool:
        return []
    pick = np.unique(np.linspace(0, len(pool) - 1, num=min(n, len(pool))).round().astype(int))
    return [pool[i] for i in pick]


def _generation(conn, info, model, tokenizer, prompts, options, progress) -> dict:
    from hartonomous.client import Client
    from hartonomous.runtimes.reference import ExactModel

    progress.stage("free generation (both paths)", generation.steps(prompts))
    client = Client(connection=conn, atom_set=info.name, spatial_tokenizer=tokenizer,
                    max_neighbors=options.max_neighbors, exact_model=ExactModel(model, tokenizer),
                    spatial_memory=options.memory)
    try:
        out = generation.side_by_side(client, prompts, max_new_tokens=options.max_new_tokens,
                                      seed=options.seed, on_step=progress.advance)
    finally:
        client.close()
    out["exact_device"] = str(next(model.parameters()).device)
    return out


def _memory_status(conn: psycopg.Connection, atom_set: str) -> dict:
    """What the set's memory holds as scoring starts (compare --memory reads it, never writes it)."""
    from hartonomous import sqlcalls

    atoms, generations, oldest, newest = sqlcalls.memory_status(conn, atom_set)
    return {"atoms": int(atoms), "generations": int(generations),
            "oldest": oldest.isoformat() if oldest else None, "newest": newest.isoformat() if newest else None}


def _clean(value):
    """JSON-safe: NaN/inf -> None, NumPy scalars -> Python."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    return value


def _per_position(fid: fid_mod.Fidelity) -> list[dict]:
    sp, ex, sig = fid.paths["spatial"], fid.exact, fid.spatial_signals
    rows = []
    for i in range(fid.n):
        rows.append({
            "text": fid.text_index[i], "position": fid.position[i], "target": fid.target[i],
            "exact_argmax": fid.exact_argmax[i], "spatial_argmax": fid.spatial_argmax[i],
            **{k: sp.values[k][i] for k in fid_mod.METRICS if k != "nll"},
            "nll_exact": ex.values["nll"][i], "nll_spatial": sp.values["nll"][i],
            "H_exact": ex.values["H"][i], "H_spatial": sig.values["H"][i],
        })
    return rows


def _assemble(info, options, texts, encoded, keep, fid, distill, knn_note, predictors, queries, gen, machine,
              atom_set, mixture, control, routing, other: Against | None = None, memory: dict | None = None,
              real: dict | None = None):
    groups = fid.blocks()                     # one resampling block per position, shared by every path
    spatial = fid_mod.summarise_path(fid.paths["spatial"], groups)
    control_path = (fid_mod.summarise_path(fid.paths[controls.RANDOM_POSITIONS], groups)
                    if control.predict else None)
    base = {name: fid_mod.summarise_path(fid.paths[name], groups) for name in predictors}
    exact = {"perplexity": metrics.perplexity(fid.exact.array("nll")),
             "perplexity_ci95": fid_mod.perplexity_ci95(fid.exact.array("nll"), groups),
             "signals": fid_mod.summarise_signals(fid.exact, groups)}
    spatial_signals = fid_mod.summarise_signals(fid.spatial_signals, groups)
    pearson = spatial["pearson"]
    report = {
        "schema_version": SCHEMA_VERSION,
        "generated_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": options.command,
        "atom_set": atom_set,
        "machine": machine,
        "settings": {
            "max_positions": options.max_positions, "max_neighbors": options.max_neighbors,
            "temperature": 1.0, "top_k": 0, "top_p": 1.0,
            "smoothing_epsilon": metrics.SMOOTHING_EPSILON, "pearson_nucleus": metrics.PEARSON_NUCLEUS,
            "top_k_overlap": metrics.TOP_K_OVERLAP, "log_base": "e", "js_unit": "nats",
            "seed": options.seed, "max_new_tokens": options.max_new_tokens,
            "split": None if options.texts else options.split,
            "history_weight": options.history_weight,
            "memory": memory,
        },
        "intervals": interval_section(fid, options.max_positions, DEFAULT_MAX_POSITIONS),
        "texts": [{"source": t.source, "held_out": t.held_out, "split": t.split, "tokens": len(e), "tokens_used": k,
                   "positions": max(k - 1, 0)} for t, e, k in zip(texts, encoded, keep)],
        "fidelity": {
            "positions": fid.n,
            "exact": exact,
            "spatial": {**spatial, "signals": spatial_signals},
            "controls": {"random_positions": control.as_dict(control_path)},
            "against": other.as_dict(fid_mod.summarise_path(fid.paths[other.name], groups)) if other else None,
            "by_position": fid_mod.by_position(fid),
            "per_position": _per_position(fid),
        },
        "baselines": {"distillation": distill.as_dict(), "knn_note": knn_note,
                      "cache": mixture[baselines.CACHE_PATH].as_dict(),
                      "infinigram_cache": mixture[baselines.INFINIGRAM_CACHE_PATH].as_dict(), "paths": base},
        "generation": gen if gen is not None else {"skipped": True},
        "queries": queries,
        "routing": routing,
        "real_text": real,
        "claims": claims.claims_table(pearson["mean"], pearson["median"], gen, queries, info.atoms, machine),
    }
    report["headline"] = headline(report)
    report["comparisons"] = paired_comparisons(fid, report["headline"], groups)
    return _clean(report)


def best_baseline(paths: dict[str, dict], key: str) -> str | None:
    """The baseline path best on `key` (a metric of HIGHER_IS_BETTER or "perplexity"): the highest mean
    where higher is better, the lowest for JS, NLL and perplexity; the first such path on ties."""
    scored = [(name, _mean(p, key)) for name, p in paths.items() if _mean(p, key) is not None]
    if not scored:
        return None
    pick = max if intervals.HIGHER_IS_BETTER[key] else min
    return pick(scored, key=lambda kv: kv[1])[0]


def _mean(path: dict, key: str) -> float | None:
    return path["perplexity"] if key == "perplexity" else path[key]["mean"]


def _ci95(path: dict, key: str) -> list[float] | None:
    return path.get("perplexity_ci95") if key == "perplexity" else path[key].get("ci95")


def headline(report: dict) -> list[dict]:
    """The few numbers printed at the end of a run.

    Fidelity rows carry the spatial path's mean and 95 % interval (`spatial`, `spatial_ci95`) and
    the paths it is compared with: the best baseline *for that metric* among every baseline path
    (`baseline_name` says which), the random-positions control (`random_positions`, None when it
    was not built: `fidelity.controls.random_positions.status` says why) and the --against set
    (`against`, None without one). `verdicts` (filled in by comparisons.paired_comparisons) words
    each comparison; `key` is the metric's key in a path. The latency rows have no interval.
    """
    fid = report["fidelity"]
    sp = fid["spatial"]
    base = report["baselines"]["paths"]
    ctrl = ((fid.get("controls") or {}).get("random_positions") or {}).get("path")
    other = fid.get("against")
    gen = report["generation"] if not report["generation"].get("skipped") else {}

    def row(metric: str, key: str, exact: float | None, claimed: float | None = None,
            exact_ci95: list[float] | None = None) -> dict:
        best = best_baseline(base, key)
        return {"metric": metric, "key": key, "spatial": _mean(sp, key), "spatial_ci95": _ci95(sp, key),
                "exact": exact, "exact_ci95": exact_ci95,
                "baseline": _mean(base[best], key) if best else None, "baseline_name": best,
                "baseline_ci95": _ci95(base[best], key) if best else None,
                "random_positions": _mean(ctrl, key) if ctrl else None,
                "random_positions_ci95": _ci95(ctrl, key) if ctrl else None,
                "against": _mean(other["path"], key) if other else None,
                "against_name": other["name"] if other else None,
                "against_ci95": _ci95(other["path"], key) if other else None,
                "verdicts": {}, "claimed": claimed}

    return [
        row("top-1 agreement", "top1", 1.0),
        row("Pearson, union of supports (mean)", "pearson", 1.0, 0.89),
        row("JS divergence to exact (mean, nats)", "js", 0.0),
        row("exact mass covered by candidates (mean)", "mass_covered", 1.0),
        row(f"perplexity (spatial smoothed, eps={metrics.SMOOTHING_EPSILON:g})", "perplexity",
            fid["exact"]["perplexity"], exact_ci95=fid["exact"].get("perplexity_ci95")),
        {"metric": "ms/token p50 (free generation)", "spatial": (gen.get("spatial") or {}).get("p50_ms"),
         "spatial_ci95": (gen.get("spatial") or {}).get("p50_ms_ci95"),
         "exact": (gen.get("exact") or {}).get("p50_ms"), "exact_ci95": (gen.get("exact") or {}).get("p50_ms_ci95"),
         "baseline": None, "baseline_name": None, "claimed": 15.0},
        {"metric": "shared buffers per KNN (p50)", "spatial": report["queries"].get("knn_buffers_p50"),
         "spatial_ci95": report["queries"].get("knn_buffers_p50_ci95"),
         "exact": None, "baseline": None, "baseline_name": None, "claimed": 6},
    ]
