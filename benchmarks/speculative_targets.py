"""`hartonomous bench --speculative --targets`: the issue's targets table for the int4 runtime, in one run,
with llama.cpp measured in the same run in its own process.

Every row reports decode and the first token apart. Decode is the time for 64 new tokens less the time
for the first, per token after it: for our exact path and llama.cpp from one generation (the first
token's time is when it came out); for our speculative paths the first token's time is the exact
path's on the same prompt (both prefill the same way; a speculative run's first round also decides
the tokens its first draft kept, which would flatter it). Greedy, EOS ignored, n prompts per row.

The stores (atom sets) each row drafts from are named in the JSON: `--atom-set` (default `code`, make
demo's 10^6-token python-source set) for the store's own held-out files and the memory rows, and a
repository store (its corpus records the files it held out) for the user's-repository row. Our forwards
use the server's thread default (hartonomous/runtimes/threads.py, chosen before each generation);
llama.cpp gets the count the same rule chooses when its process starts (on a loaded two-core machine
two llama.cpp threads wait on each other at every barrier, as torch's did: hundreds of ms per token). The machine's `uptime` is recorded before and after: a shared,
loaded machine inflates every time here, ours and llama.cpp's alike.

    hartonomous bench --speculative --targets --prompts 2 --out docs/results
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
UNSEEN_FILES = ("hartonomous/engine.py", "hartonomous/speculative/learned.py", "hartonomous/runtimes/threads.py",
                "hartonomous/memory.py")            # this project's code: in no store
OPENING_TOKENS = 256          # tokens of a file before the continuation point
LONG_PROMPT = 1024            # the cold and the extended prompt's shared prefix
EXTEND = 32                   # tokens a prompt adds to a recent one
LOOKUP_LENGTHS = (2, 4, 10)   # llama-cpp-python's LlamaPromptLookupDecoding num_pred_tokens tried
BUSY_STEPS = 20               # decode steps timed, quiet and beside a busy neighbour
START_RUNS = 3                # CLI process starts timed (after one warm-up)
REPO_STORE_PREFIX = "completion-"   # a repository store built by bench --completion (held-out files excluded)


@dataclass(frozen=True)
class Target:
    """One row of the issue's table: how its value is read from the measurements and what it must be."""

    key: str
    what: str
    now: str                  # the "now" column
    goal: str
    ok: Callable[[float], bool]
    unit: str
    value: Callable[[dict], float | None]


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _get(m: dict, path: str) -> float | None:
    node = m
    for part in path.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return None
        node = node[part]
    return float(node)


def _min(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


TARGETS: tuple[Target, ...] = (
    Target("exact_vs_llama", "our exact decode vs llama.cpp's own, ms/token (prompt excluded)",
           "1.27–1.48× slower (short prompts), 1.08× (256-token prompts)", "≤ 1.0×", lambda v: v <= 1.0, "×",
           lambda m: _ratio(_get(m, "unseen.exact.decode_ms"), _get(m, "unseen.llama.decode_ms"))),
    Target("first_token_cold", "first token after a 1,024-token prompt, cold", "3.6 s (llama.cpp 4.6 s)",
           "≤ 1.2 s", lambda v: v <= 1.2, "s", lambda m: _get(m, "prompt.ours.cold_s")),
    Target("first_token_extend", "first token when the prompt extends a recent one by 32 tokens (1,024-token "
           "prefix)", "3.6 s", "≤ 0.15 s", lambda v: v <= 0.15, "s", lambda m: _get(m, "prompt.ours.extend_s")),
    Target("repository_vs_llama", "speculative, held-out files of a repository whose other files are in the store, "
           "vs llama.cpp, decode", "0.85× (12.4 vs 10.0 ms)", "≥ 1.5×", lambda v: v >= 1.5, "×",
           lambda m: _ratio(_get(m, "repository.llama.decode_ms"), _get(m, "repository.speculative.decode_ms"))),
    Target("corpus_vs_llama", "speculative, held-out Python files of the store's own corpus, vs llama.cpp",
           "1.10–1.23× (those rows included the prompt)", "≥ 2.0×", lambda v: v >= 2.0, "×",
           lambda m: _ratio(_get(m, "corpus.llama.decode_ms"), _get(m, "corpus.speculative.decode_ms"))),
    Target("corpus_vs_llama_lookup", "speculative, held-out Python files, vs llama.cpp with prompt-lookup drafting "
           "(best of its draft lengths 2/4/10)", "—", "≥ 1.2×", lambda v: v >= 1.2, "×",
           lambda m: _ratio(_get(m, "corpus.llama_lookup_best.decode_ms"), _get(m, "corpus.speculative.decode_ms"))),
    Target("memory_second_vs_llama", "speculative + memory, second asking of a repeated request, vs llama.cpp",
           "0.89–0.98× (askings mixed)", "≥ 2.0×", lambda v: v >= 2.0, "×",
           lambda m: _ratio(_get(m, "corpus.llama.decode_ms"), _get(m, "memory.second.decode_ms"))),
    Target("speculative_vs_plain", "speculative vs plain, same runtime: short free prompts, and code the store has "
           "not seen (the lower of the two)", "0.91–1.04×; 0.79× on unseen code", "never < 0.97×",
           lambda v: v >= 0.97, "×",
           lambda m: _min(_ratio(_get(m, "short.exact.decode_ms"), _get(m, "short.speculative.decode_ms")),
                          _ratio(_get(m, "unseen.exact.decode_ms"), _get(m, "unseen.speculative.decode_ms")))),
    Target("augmented_cost", "augmented path's cost over exact, per token", "+1.46 ms (1 thread), +2.59 ms "
           "(2 threads)", "≤ +0.5 ms", lambda v: v <= 0.5, "ms", lambda m: _get(m, "augmented.difference_ms")),
    Target("process_start", "first token after process start, CLI, warm disk cache", "2.77–2.94 s", "≤ 2.5 s",
           lambda v: v <= 2.5, "s", lambda m: _get(m, "start.median_s")),
    Target("busy_neighbour", "decode step with a busy neighbour process (2 cores), over the quiet step",
           "25 ms → 1.8 s", "≤ 3×", lambda v: v <= 3.0, "×",
           lambda m: _ratio(_get(m, "busy.busy_ms"), _get(m, "busy.quiet_ms"))),
)


def evaluate(measured: dict) -> list[dict]:
    """Every target's row: the measured value (None where it was not measured), the target, and met
    (None where not measured). A miss stays a row."""
    rows = []
    for t in TARGETS:
        value = t.value(measured)
        rows.append({"key": t.key, "what": t.what, "now": t.now, "target": t.goal, "unit": t.unit,
                     "measured": None if value is None else round(value, 3),
                     "met": None if value is None else bool(t.ok(value)),
                     "verdict": "not measured" if value is None else ("met" if t.ok(value) else "missed")})
    return rows


def _fmt(row: dict) -> str:
    v = row["measured"]
    if v is None:
        return "not measured"
    return {"×": f"{v:.2f}×", "s": f"{v:.2f} s", "ms": f"{v:+.2f} ms"}.get(row["unit"], f"{v:g}")


def table(rows: list[dict]) -> str:
    """The issue's table with this run's column and the verdict."""
    lines = ["| measure | before | target | measured | met |", "|---|---:|---:|---:|---|"]
    for r in rows:
        verdict = "—" if r["met"] is None else r["verdict"]
        lines.append(f"| {r['what']} | {r['now']} | {r['target']} | {_fmt(r)} | {verdict} |")
    return "\n".join(lines)


# --- llama.cpp, in its own process ---------------------------------------------------------------

def _llama_generate(llm, ids: list[int], new_tokens: int) -> dict:
    """One greedy generation: first token's seconds, decode ms/token after it, the tokens."""
    out, t0, first = [], time.perf_counter(), None
    for token in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(int(token))
        if first is None:
            first = time.perf_counter() - t0
        if len(out) == new_tokens:
            break
    total = time.perf_counter() - t0
    return {"first_token_s": first, "decode_ms": 1000 * (total - first) / (len(out) - 1) if len(out) > 1 else None,
            "tokens": out}


def llama_worker(job: dict) -> dict:
    """llama.cpp's measurements for `job` (token prompts), in this process: plain decoding per prompt kind,
    prompt-lookup decoding (LlamaPromptLookupDecoding) per draft length, the first token after a cold
    long prompt, and after a prompt extending it (llama-cpp-python reuses the KV cache of the common
    prefix of the previous generate: its server's cache_prompt)."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    import llama_cpp

    options = dict(model_path=job["gguf"], n_ctx=4096, n_threads=job["threads"], n_threads_batch=job["threads"],
                   seed=0, verbose=False)
    n = job["new_tokens"]
    llm = Llama(**options)
    _llama_generate(llm, job["kinds"]["short"][0], 8)          # warm-up
    result: dict = {"version": llama_cpp.__version__, "threads": job["threads"], "kinds": {}}
    for kind, prompts in job["kinds"].items():
        runs = []
        for ids in prompts:
            llm.reset()
            runs.append(_llama_generate(llm, ids, n))
        result["kinds"][kind] = runs
    lookup = Llama(**{**options, "n_ctx": 1024}, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_LENGTHS[0]))
    _llama_generate(lookup, job["kinds"]["short"][0], 8)
    result["lookup"] = {}
    for length in LOOKUP_LENGTHS:
        lookup.draft_model = LlamaPromptLookupDecoding(num_pred_tokens=length)
        runs = []
        for ids in job["lookup_prompts"]:
            lookup.reset()
            runs.append(_llama_generate(lookup, ids, n))
        result["lookup"][str(length)] = runs
    del lookup
    long_ids = job["long_prompt"]
    cold = []
    for _ in range(job["prompt_repeats"]):
        llm.reset()
        cold.append(_llama_generate(llm, long_ids[:LONG_PROMPT], 1)["first_token_s"])
    llm.reset()
    _llama_generate(llm, long_ids[:LONG_PROMPT], 1)             # the recent request
    extend = _llama_generate(llm, long_ids, 1)["first_token_s"]   # reuses the 1,024-token prefix
    result["prompt"] = {"cold_runs_s": cold, "cold_s": min(cold), "extend_s": extend}
    return result


def run_llama(job: dict) -> dict:
    """llama_worker in a child process (its threads do not share ours)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.speculative_targets", "--llama-worker"],
                          input=json.dumps(job), capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp's process failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


# --- ours -----------------------------------------------------------------------------------------

def file_opening(tokenizer, path: Path, tokens: int = OPENING_TOKENS) -> list[int]:
    return tokenizer.encode(path.read_text(encoding="utf-8"))[:tokens]


def repository_store(conn, tokenizer, name: str | None) -> tuple[str, Path, list[str]] | None:
    """(store, repository root, held-out files) of a repository store whose corpus records the files it
    held out: `name`, or the first store built by bench --completion."""
    from hartonomous.backends.spatial import SpatialBackend

    names = [name] if name else [r[0] for r in conn.execute(
        "SELECT name FROM atom_sets WHERE name LIKE %s ORDER BY name", (REPO_STORE_PREFIX + "%",))]
    for store in names:
        corpus = SpatialBackend(conn, store, tokenizer=tokenizer).atom_set.stats.corpus
        held = re.search(r"\(excluding (.*)\)", corpus.source or "")
        if held and corpus.files:
            root = Path(corpus.files[0])
            files = [f for f in held.group(1).split(", ") if (root / f).is_file()]
            if files:
                return store, root, files
    return None


def _decode_ms(result, first_s: float) -> float | None:
    n = len(result.token_ids)
    return 1000 * (result.timings.total_s - first_s) / (n - 1) if n > 1 else None


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


class Ours:
    """Our paths on one int4 model, one Client per store (each carries its own draft learning)."""

    def __init__(self, conn, model, new_tokens: int):
        from hartonomous.runtimes.threads import ThreadPolicy

        self.conn, self.model, self.new_tokens = conn, model, new_tokens
        self.policy = ThreadPolicy(None)
        self.threads: list[int] = []
        self.clients: dict = {}

    def client(self, store: str, **options):
        from hartonomous.client import Client

        key = (store, tuple(sorted(options)))
        if key not in self.clients:
            self.clients[key] = Client(connection=self.conn, atom_set=store, runtime="int4", exact_model=self.model,
                                       **options)
        return self.clients[key]

    def generate(self, client, path: str, ids: list[int]):
        self.threads.append(self.policy.apply())
        return client.generate(ids, path, max_new_tokens=self.new_tokens, temperature=0.0, stop_at_eos=False)

    def compare(self, store: str, prompts: list[list[int]]) -> dict:
        """Exact and speculative on each prompt: decode, first token, identity, drafting stats."""
        client = self.client(store)
        exact, spec = [], []
        for ids in prompts:
            e = self.generate(client, "exact", ids)
            s = self.generate(client, "speculative", ids)
            first = e.timings.per_token_s[0]
            exact.append({"first_token_s": first, "decode_ms": _decode_ms(e, first)})
            spec.append({"decode_ms": _decode_ms(s, first), "identical": s.token_ids == e.token_ids,
                         "acceptance": s.stats.acceptance_rate, "tokens_per_forward": s.stats.tokens_per_forward,
                         "warm_start": s.stats.warm_start, "own_first_round_s": s.timings.per_token_s[0]})
        return {"store": store, "prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
                "exact": {"decode_ms": _mean(r["decode_ms"] for r in exact),
                          "first_token_s": _mean(r["first_token_s"] for r in exact), "runs": exact},
                "speculative": {"decode_ms": _mean(r["decode_ms"] for r in spec),
                                "identical": f"{sum(r['identical'] for r in spec)}/{len(spec)}",
                                "acceptance": _mean(r["acceptance"] for r in spec), "runs": spec}}

    def memory(self, store: str, prompts: list[list[int]], exact_first: list[float]) -> dict:
        """Speculative + memory: each prompt asked twice (the memory emptied before and after)."""
        from hartonomous.memory import MemoryPolicy, MemoryWriter

        writer = MemoryWriter(policy=MemoryPolicy(allow_ignore_eos=True))
        if writer.status(store).atoms:
            writer.close()
            return {"store": store, "skipped": f"store '{store}' has a memory already (left alone)"}
        try:
            client = self.client(store, memory=True, remember=writer)
            rows: dict = {"store": store}
            for asking in ("first", "second"):
                runs = []
                for ids, first in zip(prompts, exact_first):
                    r = self.generate(client, "speculative", ids)
                    runs.append({"decode_ms": _decode_ms(r, first), "acceptance": r.stats.acceptance_rate,
                                 "tokens_per_forward": r.stats.tokens_per_forward})
                rows[asking] = {"decode_ms": _mean(x["decode_ms"] for x in runs), "runs": runs}
            return rows
        finally:
            writer.forget(store)
            writer.close()

    def prompt(self, ids: list[int], repeats: int) -> dict:
        """First token after the long prompt cold (the runtime's prefill) and extending a recent one through
        the server's prefix cache."""
        from hartonomous.runtimes.prefix_cache import with_prefix_cache

        cold = []
        for _ in range(repeats + 1):                       # the first warms up
            self.threads.append(self.policy.apply())
            t0 = time.perf_counter()
            self.model.prefill(ids[:LONG_PROMPT], self.model.new_cache())
            cold.append(time.perf_counter() - t0)
        cached = with_prefix_cache(self.model, 1024)
        cached.prefill(ids[:LONG_PROMPT], cached.new_cache())
        self.threads.append(self.policy.apply())
        t0 = time.perf_counter()
        cached.prefill(ids, cached.new_cache())
        extend = time.perf_counter() - t0
        return {"cold_runs_s": cold[1:], "cold_s": min(cold[1:]), "extend_s": extend,
                "prefix_cache": cached.prefix_cache.stats()}

    def busy(self, ids: list[int]) -> dict:
        """Median decode step, quiet, then beside a process spinning on one core."""
        client = self.client(next(iter(self.clients))[0])

        def steps() -> tuple[float, int]:
            r = self.generate(client, "exact", ids)
            return 1000 * statistics.median(r.timings.per_token_s[1:BUSY_STEPS + 1]), self.threads[-1]

        quiet, quiet_threads = steps()
        spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(1.0)
            busy, busy_threads = steps()
        finally:
            spinner.kill()
            spinner.wait()
        return {"quiet_ms": quiet, "busy_ms": busy, "threads": {"quiet": quiet_threads, "busy": busy_threads},
                "steps": BUSY_STEPS, "neighbour": "python -c 'while True: pass'"}


def process_start(runs: int = START_RUNS) -> dict:
    """Whole-process wall time of the CLI's one-token exact generation (after one warm-up run)."""
    cli = Path(sys.executable).with_name("hartonomous")
    command = [str(cli), "generate", "def fibonacci(n):", "--path", "exact", "--runtime", "int4",
               "--max-new-tokens", "1", "--temperature", "0"]
    times = []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            return {"error": done.stderr.strip()[-500:]}
        if i:
            times.append(time.perf_counter() - t0)
    return {"command": " ".join(command[1:]), "runs_s": times, "median_s": statistics.median(times)}


def uptime() -> str:
    done = subprocess.run(["uptime"], capture_output=True, text=True)
    return done.stdout.strip()


def run(url: str, *, atom_set: str | None = "code", repository: str | None = None, prompts: int = 2,
        new_tokens: int = 64, prompt_repeats: int = 2) -> dict:
    """Every target's measurements (see the module docstring) and the evaluated table."""
    import psycopg

    from benchmarks.augmented import measure as augmented_measure
    from benchmarks.prefill import held_out_ids
    from benchmarks.speculative import SHORT_PROMPTS, document_prompts
    from hartonomous import measure
    from hartonomous.backends.spatial import SpatialBackend
    from hartonomous.errors import UserError
    from hartonomous.model import resolve_source
    from hartonomous.runtimes import int4_forward_summary, load_exact_model
    from hartonomous.runtimes.threads import ThreadPolicy
    from hartonomous.splits import recorded_halves

    started, uptime_before = time.strftime("%Y-%m-%dT%H:%M:%S%z"), uptime()
    phases: dict[str, float] = {}
    clock = time.perf_counter()

    def phase(name: str) -> None:
        nonlocal clock
        phases[name] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()

    model = load_exact_model("int4", "smollm2", "cpu")
    tokenizer = model.tokenizer
    with psycopg.connect(url, autocommit=True) as conn:
        corpus_store = SpatialBackend(conn, atom_set, tokenizer=tokenizer).atom_set
        holdout = recorded_halves(corpus_store.stats).test if corpus_store.stats.holdout else ""
        if not holdout:
            raise UserError(f"atom set '{corpus_store.name}' records no held-out text; pass --atom-set with a "
                            "context set (make demo builds `code`)")
        repo = repository_store(conn, tokenizer, repository)
        kinds = {"short": [tokenizer.encode(p) for p in SHORT_PROMPTS[:max(prompts, 3)]],
                 "unseen": [file_opening(tokenizer, ROOT / f) for f in UNSEEN_FILES[:prompts]],
                 "corpus": [tokenizer.encode(p) for p in document_prompts(holdout, tokenizer, prompts, OPENING_TOKENS)]}
        if repo is not None:
            kinds["repository"] = [file_opening(tokenizer, repo[1] / f) for f in repo[2][:prompts]]
        long_prompt = held_out_ids(tokenizer, LONG_PROMPT + EXTEND)     # prefill.py's prompt
        source = resolve_source("smollm2")
        phase("set_up_s")
        llama_threads = ThreadPolicy(None).choose()     # the same rule as ours: 2 threads beside busy
        llama = run_llama({"gguf": str(source.directory / source.gguf_file), "threads": llama_threads,
                           "new_tokens": new_tokens, "kinds": kinds, "lookup_prompts": kinds["corpus"],
                           "long_prompt": long_prompt, "prompt_repeats": prompt_repeats})
        phase("llama_cpp_s")

        ours = Ours(conn, model, new_tokens)
        warm = ours.client(corpus_store.name)
        for path in ("exact", "speculative"):
            ours.generate(warm, path, kinds["short"][0])
        phase("warm_up_s")
        measured: dict = {}
        for kind in ("unseen", "short", "corpus"):
            measured[kind] = ours.compare(corpus_store.name, kinds[kind])
        if repo is not None:
            measured["repository"] = {**ours.compare(repo[0], kinds["repository"]), "root": str(repo[1]),
                                      "held_out_files": repo[2][:prompts]}
        phase("exact_and_speculative_s")
        firsts = [r["first_token_s"] for r in measured["corpus"]["exact"]["runs"]]
        measured["memory"] = ours.memory(corpus_store.name, kinds["corpus"], firsts)
        phase("memory_s")
        measured["prompt"] = {"ours": ours.prompt(long_prompt, prompt_repeats), "llama": llama["prompt"],
                              "tokens": LONG_PROMPT, "extend_tokens": EXTEND}
        phase("prompt_s")
        try:
            aug = augmented_measure(ours.client(corpus_store.name), SHORT_PROMPTS[:prompts], new_tokens // 2)
            measured["augmented"] = {"difference_ms": aug["difference_ms"], "store": corpus_store.name,
                                     "methods": aug["methods"], "prompts": prompts}
        except Exception as exc:      # a store without a gate: the row says why
            measured["augmented"] = {"error": str(exc).splitlines()[0]}
        phase("augmented_s")
        measured["busy"] = ours.busy(file_opening(tokenizer, ROOT / UNSEEN_FILES[0], 64))
        phase("busy_neighbour_s")
        measured["start"] = process_start()
        phase("process_start_s")

        for kind, runs in llama["kinds"].items():
            if kind in measured:
                measured[kind]["llama"] = {"decode_ms": _mean(r["decode_ms"] for r in runs),
                                           "first_token_s": _mean(r["first_token_s"] for r in runs),
                                           "runs": [{k: v for k, v in r.items() if k != "tokens"} for r in runs]}
        lookup = {length: _mean(r["decode_ms"] for r in runs) for length, runs in llama["lookup"].items()}
        best = min((ms, length) for length, ms in lookup.items() if ms is not None)
        measured["corpus"]["llama_lookup"] = {f"draft_{k}": {"decode_ms": v} for k, v in lookup.items()}
        measured["corpus"]["llama_lookup_best"] = {"decode_ms": best[0], "num_pred_tokens": int(best[1])}
        for c in ours.clients.values():
            c.close()
        machine = measure.describe_machine(conn, "cpu", "smollm2")
    rows = evaluate(measured)
    return {"mode": "targets", "started": started, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "uptime_before": uptime_before, "uptime_after": uptime(),
            "runtime": "int4", "forward": int4_forward_summary(), "llama_cpp": llama["version"],
            "llama_cpp_threads": llama["threads"], "our_threads_chosen": sorted(set(ours.threads)),
            "stores": {"corpus": corpus_store.name, "repository": repo[0] if repo else None,
                       "repository_note": None if repo else "no repository store with recorded held-out files",
                       "store_10e7": "none in this database (not built for this run)"},
            "prompts": prompts, "new_tokens": new_tokens, "phases_s": phases,
            "measured": measured, "targets": rows, "machine": machine}


def markdown(results: dict, command: str) -> str:
    m = results["machine"]
    return "\n".join([
        "# The int4 runtime's targets beside llama.cpp", "",
        f"Command: `{command}`", "",
        f"{m.get('cpu')}, {m.get('cores')} cores; {results['forward']}; llama-cpp-python {results['llama_cpp']} "
        f"({results['llama_cpp_threads']} threads, its own process); our threads chosen: "
        f"{results['our_threads_chosen']}; n = {results['prompts']} prompts per row, {results['new_tokens']} new "
        f"tokens; stores: {results['stores']}.", "",
        f"uptime before: `{results['uptime_before']}`; after: `{results['uptime_after']}`.", "",
        table(results["targets"]), "",
        f"Where the time went (s): {results['phases_s']}.", ""])


def write(results: dict, out: Path, command: str) -> tuple[Path, Path]:
    """<out>/<date>-targets.json (with the command) and .md."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{results['started'][:10]}-targets"
    results = {**results, "command": command}
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    stem.with_suffix(".md").write_text(markdown(results, command))
    return stem.with_suffix(".json"), stem.with_suffix(".md")


def llama_main() -> None:
    print(json.dumps(llama_worker(json.loads(sys.stdin.read()))))


if __name__ == "__main__":
    if sys.argv[1:] == ["--llama-worker"]:
        llama_main()
