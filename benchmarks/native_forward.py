"""The int4 runtime's native forward against its Python forward, and llama.cpp's own decoding, in one run.

Per forward (SmolLM2's GGUF, greedy): `decode_ms` is the time per token of 64 new tokens after the
first one (a 256-token prompt of held-out code, so the prompt is excluded), `first_token_s` the
time to the first token after a 1,024-token prompt (the prefill, best of `--repeats` after a
warm-up), `c_ms` the cost of verifying k tokens at once after the same 256-token prompt (median of
five). llama.cpp (`llama_cpp.Llama.generate`, the same threads) is measured the same way where it is
installed. On one thread the CPU time of the calling thread is recorded beside the wall time: on a
shared machine it is what other work inflates least. The machine's load average is recorded before and after, since the machine is shared.
Writes JSON to stdout (or --out).

    .venv/bin/python benchmarks/native_forward.py --threads 1 --out docs/results/2026-12-02-native-forward.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prefill import commit, cpu_name, held_out_ids  # noqa: E402

NEW_TOKENS = 64
VERIFY = (1, 2, 4, 8)


def decode_ms(model, prompt: list[int]) -> tuple[float, float]:
    """Wall and this thread's CPU time per token (the CPU time is what a busy machine inflates least;
    with one thread it is the whole forward's)."""
    cache = model.new_cache()
    token = int(model.prefill(prompt, cache).argmax())
    started, cpu = time.perf_counter(), time.thread_time()
    for _ in range(NEW_TOKENS):
        token = int(model.decode_one_token(token, cache).argmax())
    return ((time.perf_counter() - started) / NEW_TOKENS * 1000, (time.thread_time() - cpu) / NEW_TOKENS * 1000)


def first_token_s(model, prompt: list[int], repeats: int) -> tuple[float, float]:
    """Best wall and CPU time of the prefill."""
    model.prefill(prompt, model.new_cache())
    times = []
    for _ in range(repeats):
        cache = model.new_cache()
        started, cpu = time.perf_counter(), time.thread_time()
        model.prefill(prompt, cache)
        times.append((time.perf_counter() - started, time.thread_time() - cpu))
    return min(t[0] for t in times), min(t[1] for t in times)


def verify_ms(model, prompt: list[int]) -> dict[int, float]:
    cache = model.new_cache()
    model.prefill(prompt, cache)
    out = {}
    for k in VERIFY:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            model.extend(list(range(100, 100 + k)), cache, k)
            times.append(time.perf_counter() - started)
            cache.crop(len(prompt))
        out[k] = statistics.median(times) * 1000
    return out


def llama_row(threads: int, prompt: list[int], long_prompt: list[int]) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from hartonomous.model import resolve_source

    source = resolve_source("smollm2")
    llm = Llama(model_path=str(source.directory / source.gguf_file), n_ctx=2048, n_threads=threads,
                n_threads_batch=threads, seed=0, verbose=False)

    def generate(ids: list[int], count: int) -> list[tuple[float, float]]:
        stamps = [(time.perf_counter(), time.thread_time())]
        for _ in llm.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            stamps.append((time.perf_counter(), time.thread_time()))
            if len(stamps) == count + 1:
                break
        return stamps

    generate(prompt, 4)                                                   # warm-up
    stamps = generate(prompt, NEW_TOKENS + 1)
    first = generate(long_prompt, 1)
    import llama_cpp

    row = {"decode_ms": (stamps[-1][0] - stamps[1][0]) / NEW_TOKENS * 1000,
           "first_token_s": first[1][0] - first[0][0], "version": getattr(llama_cpp, "__version__", "unknown")}
    if threads == 1:                  # llama.cpp computes in the calling thread: its CPU time is the forward's
        row["decode_cpu_ms"] = (stamps[-1][1] - stamps[1][1]) / NEW_TOKENS * 1000
        row["first_token_cpu_s"] = first[1][1] - first[0][1]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    from hartonomous.runtimes import load_exact_model
    from hartonomous.runtimes.int4 import Int4Model

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    native = load_exact_model("int4", "smollm2", "cpu")
    if native.forward_kind != "native":
        raise SystemExit("the native int4 forward is not built here: make install-native")
    python = Int4Model(native.weights, native.tokenizer, native.name, forward="python")
    native.prepare_prefill()
    ids = held_out_ids(native.tokenizer, 1024)
    prompt = ids[:256]
    rows = {}
    for model in (python, native):
        decode, decode_cpu = decode_ms(model, prompt)
        first, first_cpu = first_token_s(model, ids, args.repeats)
        rows[model.forward_kind] = {"decode_ms": decode, "first_token_s": first, "c_ms": verify_ms(model, prompt)}
        if args.threads == 1:
            rows[model.forward_kind].update(decode_cpu_ms=decode_cpu, first_token_cpu_s=first_cpu)
    llama = llama_row(args.threads, prompt, ids)
    if llama is not None:
        rows["llama_cpp"] = llama
    report = {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": args.threads, "torch": torch.__version__,
              "commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load_before": load_before, "load_after": os.getloadavg(), "prompt_tokens": len(prompt),
              "long_prompt_tokens": len(ids), "new_tokens": NEW_TOKENS, "rows": rows}
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
