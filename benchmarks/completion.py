"""`hartonomous bench --completion`: repository-level line completion on held-out files.

For each repository: its held-out files (chosen by path with the seed), the store of the rest built
or checked (benchmarks.line_completion.stores), the leakage check, the retrieval index over the files
the store holds; then N lines per held-out file (seeded), each completed by every system
(benchmarks.line_completion.run) from the same in-file prompt. Writes <out>/bench-completion.json
(every completion, the summaries, the command, the machine's load) and .md, and a plot of EM per
system per repository with intervals (<out>/completion-em.png).
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.line_completion import diagnose, metrics
from benchmarks.line_completion.prompts import NEW_TOKENS, Budgets
from benchmarks.line_completion.run import SYSTEMS

PAIRS = (("augmented", "exact"), ("augmented", "exact + retrieval"), ("augmented + retrieval", "exact + retrieval"),
         ("augmented + retrieval", "augmented"), ("augmented", "counting ⊕ exact"), ("exact + retrieval", "exact"))
POOLED = "pooled"


def prepare_repository(conn, root: Path, *, held_out_files: int, seed: int, model: str, rebuild: bool,
                       model_objects=None, gate: bool = True, log=print, build_options: dict | None = None) -> dict:
    """The repository's held-out files, its store (built or reused) and what the store holds,
    checked for leakage."""
    from hartonomous.atomset import load_atom_set
    from benchmarks.line_completion import stores
    from hartonomous.errors import UserError

    root = root.resolve()
    held = stores.choose_held_out(root, held_out_files, seed)
    repo = stores.Repository(root, held)
    name = stores.store_name(repo)
    info, built_s = None, None
    if not rebuild:
        try:
            info = load_atom_set(conn, name)
        except UserError:
            info = None
        if info is not None and not stores.recorded_for(info, repo):
            info = None
    if info is None:
        log(f"[completion] building store {name} of {root.name} ({len(held)} files held out)")
        start = time.perf_counter()
        stores.build_store(conn, repo, name, model=model, model_objects=model_objects, gate=gate,
                           **(build_options or {}))
        built_s = round(time.perf_counter() - start, 1)
        info = load_atom_set(conn, name)
    documents = stores.store_documents(info)
    stores.check_leakage(repo, documents, name)
    return {"repo": repo, "store": info, "documents": documents, "build_seconds": built_s}


def line_prompts(repo, tokenizer, lines_per_file: int, seed: int, in_file: int) -> list:
    from benchmarks.line_completion.lines import select_lines
    from benchmarks.line_completion.prompts import line_prompt

    prompts = []
    for path in repo.held_out:
        text = (repo.root / path).read_text(encoding="utf-8").replace("\r\n", "\n")
        for line in select_lines(text, lines_per_file, seed):
            prompts.append(line_prompt(tokenizer, path, text, line, in_file))
    return prompts


def run(conn, roots: list[Path], *, budgets: Budgets, held_out_files: int = 4, lines_per_file: int = 5, seed: int = 0,
        model: str = "smollm2", rebuild: bool = False, model_objects=None, gate: bool = True,
        systems: tuple[str, ...] = SYSTEMS, speculative: bool = True, log=print, build_options: dict | None = None,
        after_build=None) -> dict:
    """Every repository's lines through every system; the report's dict (see `summarise`)."""
    from benchmarks.line_completion.retrieval import Retriever, with_retrieval
    from benchmarks.line_completion.run import counting_system, run_line
    from hartonomous.corpus import teacher
    from hartonomous.measure import load_average
    from hartonomous.paths.context import PathResources, build_engine
    from hartonomous.runtimes.reference import ExactModel

    if model_objects is None:
        from hartonomous.model import load_model, load_tokenizer

        model_objects = (load_model(model, "cpu"), load_tokenizer(model))
    hf_model, tokenizer = model_objects
    budgets.check(teacher.max_context(hf_model))
    exact_model = ExactModel(hf_model, tokenizer)
    load_start = load_average()
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    prepared = [prepare_repository(conn, r, held_out_files=held_out_files, seed=seed, model=model, rebuild=rebuild,
                                   model_objects=model_objects, gate=gate, log=log, build_options=build_options)
                for r in roots]
    if after_build is not None:                 # tests: a hand-made gate in place of a fitted one
        for item in prepared:
            after_build(item["store"].name)
    completions, speculative_times, repos, forced = [], [], [], []
    for item in prepared:
        repo, info = item["repo"], item["store"]
        retriever = Retriever([(d.source.split("/", 1)[-1], d.text) for d in item["documents"]])
        resources = PathResources(connection=conn, atom_set=info.name, model=model, exact_model=exact_model)
        backends = {}
        counting_info = None
        for system in systems:
            if system in ("exact", "exact + retrieval"):
                backends[system] = resources.exact_backend()
            elif system in ("augmented", "augmented + retrieval"):
                backends[system] = resources.backend("augmented")
            elif system == "spatial":
                backends[system] = resources.spatial_beside(resources.exact_backend())
            elif system == "counting ⊕ exact":
                backends[system], counting_info = counting_system(info, hf_model, tokenizer, resources.exact_backend())
        engine = build_engine("speculative", resources) if speculative and "exact" in systems else None
        shared = resources.exact_backend()          # the one prefill per prompt of the model's systems
        prompts = line_prompts(repo, tokenizer, lines_per_file, seed, budgets.in_file)
        log(f"[completion] {repo.name}: {len(prompts)} lines of {len(repo.held_out)} held-out files, "
            f"store {info.name} ({info.atoms:,} atoms)")
        started = time.perf_counter()
        for i, prompt in enumerate(prompts):
            retrieved = None
            if RETRIEVAL_SYSTEMS & set(systems):
                block, _ = retriever.block(prompt.prefix, tokenizer, budgets.retrieval, exclude_path=prompt.path)
                retrieved = with_retrieval(tokenizer, block, prompt.ids)
            first_of_file = i == 0 or prompts[i - 1].path != prompt.path     # speculative: one line per file
            done, timed, prefilled = run_line(backends, tokenizer, repo.name, prompt, retrieved,
                                              engine if first_of_file else None, exact_backend=shared)
            completions += done
            if "augmented" in backends:
                text = (repo.root / prompt.path).read_text(encoding="utf-8").replace("\r\n", "\n")
                forced += [{"repo": repo.name, **row} for row in
                           diagnose.teacher_forced(backends["augmented"], hf_model, tokenizer, prompt, text, prefilled)]
            if timed is not None:
                speculative_times.append({"repo": repo.name, "path": prompt.path, "line": prompt.line, **timed})
            if (i + 1) % 5 == 0 or i + 1 == len(prompts):
                log(f"[completion] {repo.name}: {i + 1}/{len(prompts)} lines, {time.perf_counter() - started:.0f} s")
        repos.append({"name": repo.name, "root": str(repo.root), "held_out": list(repo.held_out), "store": info.name,
                      "atoms": info.atoms, "store_documents": len(item["documents"]),
                      "store_tokens": info.stats.corpus.train_tokens, "build_seconds": item["build_seconds"],
                      "lines": len(prompts), "retrieval_chunks": len(retriever.chunks), "counting": counting_info})
        if engine is not None:
            engine.close()
    results = summarise(completions, speculative_times, systems)
    results["diagnosis"]["teacher_forced"] = {
        scope: diagnose.summarise([r for r in forced if scope == POOLED or r["repo"] == scope])
        for scope in [r["name"] for r in repos] + [POOLED]}
    results["diagnosis"]["teacher_forced_tokens"] = forced        # per token, for merging runs
    from hartonomous.measure import describe_machine

    machine = describe_machine(conn, "cpu", model)
    machine["load"] = {"start": load_start, "end": load_average()}
    results.update({"mode": "completion", "repos": repos, "systems": list(systems), "machine": machine,
                    "started": started_at,
                    "settings": {"in_file_tokens": budgets.in_file, "retrieval_tokens": budgets.retrieval,
                                 "new_tokens": NEW_TOKENS, "held_out_files": held_out_files,
                                 "lines_per_file": lines_per_file, "seed": seed, "model": model},
                    "load": {"start": load_start, "end": load_average()}})
    return results


RETRIEVAL_SYSTEMS = {"exact + retrieval", "augmented + retrieval"}


def _rows(completions: list, system: str, repo: str | None) -> list:
    return [c for c in completions if c.system == system and (repo is None or c.repo == repo)]


def summarise(completions: list, speculative_times: list, systems: tuple[str, ...]) -> dict:
    """EM and ES with intervals (files resampled) per system per repository and pooled, the paired
    differences, median latency per completion, and where the store's λ went inside a line."""
    from benchmarks.line_completion.run import summary_weights

    repo_names = list(dict.fromkeys(c.repo for c in completions))
    table: dict = {}
    for repo in repo_names + [POOLED]:
        scope = None if repo == POOLED else repo
        table[repo] = {}
        for system in systems:
            rows = _rows(completions, system, scope)
            if not rows:
                continue
            files = [f"{c.repo}/{c.path}" for c in rows]
            table[repo][system] = {"em": metrics.interval([c.em for c in rows], files),
                                   "es": metrics.interval([c.es for c in rows], files),
                                   "median_seconds": metrics.median([c.seconds for c in rows]),
                                   "median_tokens": metrics.median([c.tokens for c in rows]),
                                   "median_prompt_tokens": metrics.median([c.prompt_tokens for c in rows])}
    paired = []
    for repo in repo_names + [POOLED]:
        scope = None if repo == POOLED else repo
        for a, b in PAIRS:
            ra, rb = _rows(completions, a, scope), _rows(completions, b, scope)
            if not ra or not rb:
                continue
            key = {(c.repo, c.path, c.line): c for c in rb}
            both = [(c, key[(c.repo, c.path, c.line)]) for c in ra if (c.repo, c.path, c.line) in key]
            files = [f"{x.repo}/{x.path}" for x, _ in both]
            for metric in ("em", "es"):
                test = metrics.paired([getattr(x, metric) for x, _ in both], [getattr(y, metric) for _, y in both],
                                      files, metric, (a, b))
                paired.append({"repo": repo, **test})
    aug = _rows(completions, "augmented", None)
    exact = {(c.repo, c.path, c.line): c for c in _rows(completions, "exact", None)}
    changed = [(c, exact[(c.repo, c.path, c.line)]) for c in aug if (c.repo, c.path, c.line) in exact
               and c.predicted != exact[(c.repo, c.path, c.line)].predicted]
    diagnosis = {
        "augmented_weights": summary_weights(aug),
        "augmented_retrieval_weights": summary_weights(_rows(completions, "augmented + retrieval", None)),
        "counting_weights": summary_weights(_rows(completions, "counting ⊕ exact", None)),
        "lines": len(aug), "lines_changed_by_the_store": len(changed),
        "changed_augmented_right": sum(1 for a, _ in changed if a.em == 1.0),
        "changed_exact_right": sum(1 for _, e in changed if e.em == 1.0),
    }
    spec = {"median_seconds": metrics.median([t["seconds"] for t in speculative_times]),
            "lines": len(speculative_times), "identical": all(t["identical"] for t in speculative_times),
            "times": speculative_times} if speculative_times else None
    pooled = table.get(POOLED, {})
    ratio = lambda a, b, key: (pooled[a][key]["estimate"] / pooled[b][key]["estimate"]  # noqa: E731
                               if a in pooled and b in pooled and pooled[b][key]["estimate"] else None)
    seconds = lambda a, b: (pooled[a]["median_seconds"] / pooled[b]["median_seconds"]  # noqa: E731
                            if a in pooled and b in pooled and pooled[b]["median_seconds"] else None)
    headline = {f"{p['a']} vs {p['b']} {p['metric']}": p for p in paired if p["repo"] == POOLED}
    headline.update({"augmented over exact em": ratio("augmented", "exact", "em"),
                     "augmented over exact median seconds": seconds("augmented", "exact"),
                     "lines": len(aug)})
    return {"table": table, "paired": paired, "diagnosis": diagnosis, "speculative": spec, "headline": headline,
            "completions": [c.as_dict() for c in completions]}


# --- the report ---------------------------------------------------------------------------------

def _ci(entry: dict, digits: int = 3) -> str:
    low, high = entry["ci95"]
    if low is None:
        return f"{entry['estimate']:.{digits}f}"
    return f"{entry['estimate']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def markdown(results: dict, command: str) -> str:
    s = results["settings"]
    out = ["# Line completion on held-out files", "", f"`{command}`", "",
           f"In-file budget {s['in_file_tokens']} tokens, retrieval budget {s['retrieval_tokens']}, greedy to the end "
           f"of the line (at most {s['new_tokens']} tokens); {s['lines_per_file']} lines per held-out file, "
           f"{s['held_out_files']} files per repository, seed {s['seed']}. Load {results['load']}.", ""]
    out += ["| repository | system | EM [95 % CI] | ES [95 % CI] | median s / line | lines |", "|---|---|---|---|---|---|"]
    for repo, rows in results["table"].items():
        for system, r in rows.items():
            out.append(f"| {repo} | {system} | {_ci(r['em'])} | {_ci(r['es'])} | {r['median_seconds']:.2f} | "
                       f"{r['em']['lines']} |")
    out += ["", "Paired differences (a − b, files resampled):", "",
            "| repository | a | b | metric | difference [95 % CI] | p | verdict |", "|---|---|---|---|---|---|---|"]
    for p in results["paired"]:
        low, high = p["ci95"]
        ci = "" if low is None else f" [{low:+.3f}, {high:+.3f}]"
        pv = "" if p["p"] is None else f"{p['p']:.3g}"
        out.append(f"| {p['repo']} | {p['a']} | {p['b']} | {p['metric'].upper()} | {p['difference']:+.3f}{ci} | {pv} | "
                   f"{p['verdict']} |")
    spec = results.get("speculative")
    if spec:
        out += ["", f"Speculative over exact: median {spec['median_seconds']:.2f} s per line on {spec['lines']} lines "
                    f"(its tokens {'are' if spec['identical'] else 'are NOT'} exact's)."]
    d = results["diagnosis"]
    out += ["", f"The store changed {d['lines_changed_by_the_store']} of {d['lines']} lines: augmented right on "
                f"{d['changed_augmented_right']}, exact right on {d['changed_exact_right']}. Mean λ inside a line: "
                f"{d['augmented_weights']}."]
    tf = d.get("teacher_forced", {}).get(POOLED)
    if tf:
        out += ["", "The real lines teacher-forced after their prompts (pooled): where the store's weight and gain go.", "",
                "| tokens of the line | n | mean λ | perplexity exact | augmented | top-1 exact | augmented | "
                "store has the token |", "|---|---|---|---|---|---|---|---|"]
        for name, r in tf.items():
            out.append(f"| {name} | {r['tokens']} | {r['mean_weight']:.3f} | {r['perplexity_exact']:.2f} | "
                       f"{r['perplexity_augmented']:.2f} | {r['top1_exact']:.3f} | {r['top1_augmented']:.3f} | "
                       f"{r['store_has_it']:.3f} |")
    return "\n".join(out) + "\n"


def plot(results: dict, path: Path) -> Path:
    """EM per system per repository (and pooled) with 95 % intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    repos = list(results["table"])
    systems = [s for s in results["systems"] if any(s in results["table"][r] for r in repos)]
    width = 0.8 / len(systems)
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(repos) + 2), 4.2))
    for j, system in enumerate(systems):
        est, low, high = [], [], []
        for r in repos:
            e = results["table"][r].get(system, {}).get("em")
            value = e["estimate"] if e else np.nan
            est.append(value)
            low.append(value - e["ci95"][0] if e and e["ci95"][0] is not None else 0)
            high.append(e["ci95"][1] - value if e and e["ci95"][1] is not None else 0)
        x = np.arange(len(repos)) + (j - (len(systems) - 1) / 2) * width
        ax.bar(x, est, width, yerr=[low, high], capsize=2, label=system)
    ax.set_xticks(np.arange(len(repos)), repos)
    ax.set_ylabel("exact match (95 % CI, files resampled)")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, ncol=3, loc="upper left")
    ax.set_title("Line completion on held-out files (SmolLM2-135M)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
