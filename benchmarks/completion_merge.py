"""Merge `bench --completion` runs of one repository each into the report of all of them.

    python -m benchmarks.completion_merge OUT.json RUN.json [RUN.json ...] [--plot PNG] [--markdown MD]

Each repository is measured on its own (its lines, its store, its systems), so running the
repositories one command each and merging gives the same completions as one command over all of
them; the summaries (intervals over files, paired tests, medians, the teacher-forced diagnosis)
are computed again over the merged lines. The merged JSON records each part's command, start,
commit and load, and as its `command` the one command that runs every repository at once with the
parts' settings.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks import completion
from benchmarks.line_completion import diagnose
from benchmarks.line_completion.run import Completion


def merge(parts: list[dict]) -> dict:
    settings = parts[0]["settings"]
    for part in parts[1:]:
        if part["settings"] != settings or part["systems"] != parts[0]["systems"]:
            raise SystemExit("error: the runs were made with different settings or systems; merge runs of one setting")
    completions = [Completion(**c) for p in parts for c in p["completions"]]
    times = [t for p in parts for t in (p.get("speculative") or {}).get("times", [])]
    forced = [r for p in parts for r in p["diagnosis"].get("teacher_forced_tokens", [])]
    systems = tuple(parts[0]["systems"])
    merged = completion.summarise(completions, times, systems)
    repos = [r for p in parts for r in p["repos"]]
    merged["diagnosis"]["teacher_forced"] = {
        scope: diagnose.summarise([r for r in forced if scope == completion.POOLED or r["repo"] == scope])
        for scope in [r["name"] for r in repos] + [completion.POOLED]}
    merged["diagnosis"]["teacher_forced_tokens"] = forced
    described = [p for p in parts if "machine" in p]      # runs before 2026-12-02 17:23 UTC recorded the load only
    if not described:
        raise SystemExit("error: no run records its machine; merge runs of bench --completion as it is now")
    loads = [p.get("machine", {}).get("load") or p.get("load") for p in parts]
    machine = dict(described[0]["machine"])
    machine["load"] = {"start": loads[0]["start"], "end": loads[-1]["end"], "parts": loads}
    command = ("hartonomous bench --completion " + " ".join(f"--repo {r['root']}" for r in repos)
               + f" --lines-per-file {settings['lines_per_file']} --held-out-files {settings['held_out_files']}"
               + f" --in-file-tokens {settings['in_file_tokens']} --retrieval-tokens {settings['retrieval_tokens']}"
               + f" --seed {settings['seed']}")
    merged.update({"mode": "completion", "repos": repos, "systems": list(systems), "settings": settings,
                   "machine": machine, "started": described[0]["started"], "command": command,
                   "load": machine["load"],
                   "parts": [{"command": p.get("command"), "started": p.get("started"),
                              "commit": p.get("machine", {}).get("commit"), "load": load}
                             for p, load in zip(parts, loads)]})
    return merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--plot", type=Path, default=None)
    parser.add_argument("--markdown", type=Path, default=None)
    args = parser.parse_args()
    merged = merge([json.loads(p.read_text()) for p in args.runs])
    args.out.write_text(json.dumps(merged, indent=1, default=float, ensure_ascii=False) + "\n")
    if args.plot:
        completion.plot(merged, args.plot)
    if args.markdown:
        args.markdown.write_text(completion.markdown(merged, merged["command"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
