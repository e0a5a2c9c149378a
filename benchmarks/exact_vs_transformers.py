"""Per-token latency of the exact path (hartonomous engine + exact.py) vs transformers `generate`.

Both decode greedily (and optionally with sampling) from the same prompt on the same model,
device and threads, in one process. Per-token decode latency is
    (time for N new tokens - time for 1 new token) / (N - 1),
which removes the prefill; each value is the median over repeats, and the two sides are
interleaved so that drifting machine load hits both alike. The ratio is ours / transformers
(below 1 means the exact path is faster).

    python benchmarks/exact_vs_transformers.py --tokens 64 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

PROMPT = "The capital of France is"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--sampled", action="store_true", help="also compare T=1, top_k=40, top_p=0.9")
    parser.add_argument("--json", dest="json_out", default=None, help="write the numbers here too")
    args = parser.parse_args()

    import torch

    from hartonomous.backends.exact import ExactBackend
    from hartonomous.engine import Engine, GenerationConfig
    from hartonomous.exact import ExactModel

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    exact = ExactModel.load(args.model, args.device)
    load_s = time.perf_counter() - t0
    model, tokenizer = exact.model, exact.tokenizer
    engine = Engine(ExactBackend(exact))
    ids = tokenizer.encode(PROMPT)
    input_ids = torch.tensor([ids], device=exact.device)

    modes = {"greedy": dict(temperature=0.0)}
    if args.sampled:
        modes["sampled"] = dict(temperature=1.0, top_k=40, top_p=0.9)

    def ours(n: int, sampler: dict) -> tuple[float, list[int]]:
        config = GenerationConfig(max_new_tokens=n, stop_at_eos=False, seed=0, **sampler)
        start = time.perf_counter()
        result = engine.generate(ids, config)
        return time.perf_counter() - start, result.token_ids

    def theirs(n: int, sampler: dict) -> tuple[float, list[int]]:
        kw = (dict(do_sample=True, temperature=sampler["temperature"], top_k=sampler["top_k"],
                   top_p=sampler["top_p"]) if sampler["temperature"] > 0 else dict(do_sample=False))
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=n,
                                 min_new_tokens=n, pad_token_id=tokenizer.eos_token_id, **kw)
        return time.perf_counter() - start, out[0, len(ids):].tolist()

    report = {"model": args.model, "device": str(exact.device), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "cpu": cpu_name(), "cores": os.cpu_count(), "tokens": args.tokens,
              "repeats": args.repeats, "load_s": round(load_s, 1), "modes": {}}
    for mode, sampler in modes.items():
        ours(4, sampler), theirs(4, sampler)          # warm-up
        per_token = {"exact": [], "transformers": []}
        same_tokens = True
        for _ in range(args.repeats):
            for name, run in (("exact", ours), ("transformers", theirs)):
                t_one, _ = run(1, sampler)
                t_n, toks = run(args.tokens, sampler)
                per_token[name].append((t_n - t_one) / (args.tokens - 1))
                if mode == "greedy":
                    if name == "exact":
                        ours_tokens = toks
                    else:
                        same_tokens &= toks == ours_tokens
        med = {k: statistics.median(v) for k, v in per_token.items()}
        report["modes"][mode] = {
            "exact_ms_per_token": round(med["exact"] * 1e3, 2),
            "transformers_ms_per_token": round(med["transformers"] * 1e3, 2),
            "ratio_exact_over_transformers": round(med["exact"] / med["transformers"], 3),
            "all_ms_exact": [round(x * 1e3, 2) for x in per_token["exact"]],
            "all_ms_transformers": [round(x * 1e3, 2) for x in per_token["transformers"]],
            **({"greedy_tokens_identical": same_tokens} if mode == "greedy" else {}),
        }
    print(json.dumps(report, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
