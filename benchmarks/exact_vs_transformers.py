"""Per-token latency of the exact path (hartonomous engine + hartonomous/runtimes/reference.py) vs transformers `generate`.

Both decode greedily (and optionally with sampling) from the same prompt on the same model,
device and threads, in one process. Per-token latency is the wall time between consecutive
tokens after the first (the first pays for the prefill): for the engine, between its token
events; for transformers, between its streamer's `put` calls. We report the median and the
mean over all tokens of all repeats, and the median of the per-repeat ratios (the two sides run
back to back in each repeat, so this paired ratio is the most robust to drifting machine load).
Ratios are ours / transformers (below 1: the exact path is faster).

    python benchmarks/exact_vs_transformers.py --tokens 64 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
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


def gaps(stamps: list[float]) -> list[float]:
    """Time between consecutive tokens, from the second token on."""
    return [b - a for a, b in zip(stamps, stamps[1:])]


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
    from hartonomous.engine import Engine
    from hartonomous.runtimes.reference import ExactModel
    from hartonomous.generation_config import GenerationConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    exact = ExactModel.load(args.model, args.device)
    load_s = time.perf_counter() - t0
    model, tokenizer = exact.model, exact.tokenizer
    engine = Engine(ExactBackend(exact))
    eos = exact.eos_token_ids()
    ids = tokenizer.encode(PROMPT)
    input_ids = torch.tensor([ids], device=exact.device)

    modes = {"greedy": dict(temperature=0.0)}
    if args.sampled:
        modes["sampled"] = dict(temperature=1.0, top_k=40, top_p=0.9)

    def ours(n: int, sampler: dict) -> tuple[list[float], list[int]]:
        config = GenerationConfig(max_new_tokens=n, stop_at_eos=False, seed=0, **sampler)
        stamps, tokens = [], []
        for event in engine.stream(ids, config).events():
            stamps.append(time.perf_counter())
            tokens.append(event.token_id)
        return gaps(stamps), tokens

    def theirs(n: int, sampler: dict) -> tuple[list[float], list[int]]:
        from transformers.generation.streamers import BaseStreamer

        class Stamps(BaseStreamer):
            def __init__(self):
                self.stamps, self.prompt_seen = [], False

            def put(self, value):                 # first call: the prompt; then one call per token
                if self.prompt_seen:
                    self.stamps.append(time.perf_counter())
                self.prompt_seen = True

            def end(self):
                pass

        kw = (dict(do_sample=True, temperature=sampler["temperature"], top_k=sampler["top_k"],
                   top_p=sampler["top_p"]) if sampler["temperature"] > 0 else dict(do_sample=False))
        streamer = Stamps()
        with torch.inference_mode():
            out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=n,
                                 min_new_tokens=n, pad_token_id=tokenizer.eos_token_id, streamer=streamer, **kw)
        return gaps(streamer.stamps), out[0, len(ids):].tolist()

    report = {"model": args.model, "device": str(exact.device), "threads": torch.get_num_threads(),
              "torch": torch.__version__, "cpu": cpu_name(), "cores": os.cpu_count(),
              "load_average_before": os.getloadavg(), "tokens": args.tokens, "repeats": args.repeats,
              "load_s": round(load_s, 1), "modes": {}}
    for mode, sampler in modes.items():
        ours(4, sampler), theirs(4, sampler)          # warm-up
        per_token: dict[str, list[float]] = {"exact": [], "transformers": []}
        paired: list[float] = []          # per repeat: median ours / median theirs, run back to back
        same_tokens = True
        for repeat in range(args.repeats):
            if repeat % 2 == 0:                 # alternate who goes first
                mine, our_tokens = ours(args.tokens, sampler)
                other, their_tokens = theirs(args.tokens, sampler)
            else:
                other, their_tokens = theirs(args.tokens, sampler)
                mine, our_tokens = ours(args.tokens, sampler)
            per_token["exact"] += mine
            per_token["transformers"] += other
            # transformers' min_new_tokens masks EOS until N tokens; we keep going past EOS instead,
            # so the two agree up to our first EOS (the compute per token is the same either way)
            cut = next((i for i, t in enumerate(our_tokens) if t in eos), len(our_tokens))
            same_tokens &= our_tokens[:cut] == their_tokens[:cut]
            paired.append(statistics.median(mine) / statistics.median(other))
            print(f"[{mode}] repeat {repeat + 1}/{args.repeats}: exact {statistics.median(mine) * 1e3:.1f} ms, "
                  f"transformers {statistics.median(other) * 1e3:.1f} ms (medians)", file=sys.stderr, flush=True)
        med = {k: statistics.median(v) for k, v in per_token.items()}
        mean = {k: statistics.fmean(v) for k, v in per_token.items()}
        report["modes"][mode] = {
            "exact_median_ms": round(med["exact"] * 1e3, 2),
            "transformers_median_ms": round(med["transformers"] * 1e3, 2),
            "ratio_median": round(med["exact"] / med["transformers"], 3),
            "exact_mean_ms": round(mean["exact"] * 1e3, 2),
            "transformers_mean_ms": round(mean["transformers"] * 1e3, 2),
            "ratio_mean": round(mean["exact"] / mean["transformers"], 3),
            "ratio_paired_median": round(statistics.median(paired), 3),
            "ratios_per_repeat": [round(r, 3) for r in paired],
            "tokens_measured_per_side": len(per_token["exact"]),
            **({"greedy_tokens_identical_before_eos": same_tokens, "first_eos_at": cut}
               if mode == "greedy" else {}),
        }
    report["load_average_after"] = os.getloadavg()
    print(json.dumps(report, indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
