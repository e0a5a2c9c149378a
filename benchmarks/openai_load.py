"""Concurrent streaming clients against any OpenAI-compatible server, with the official `openai` client.

N asyncio clients (16 by default) stream `/v1/completions` for S seconds (60 by default), each
cycling through the given model ids and a few prompts, one request after another. Per model:
requests, errors (any exception, or a stream without a finish_reason), streamed tokens, tokens/s
over the run, time to first token (p50, p95). The same script measures `hartonomous serve` and a
peer (llama-cpp-python's `python -m llama_cpp.server --model FILE.gguf`) on the same GGUF: the
peer's model id is whatever its /v1/models lists.

    .venv/bin/python benchmarks/openai_load.py --url http://127.0.0.1:8000/v1 \\
        --models smollm2,smollm2:augmented:code,smollm2:speculative:code --clients 16 --seconds 60 \\
        --json openai-load.json

The JSON records the command, the machine's load average before and after, and the commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PROMPTS = ("def fibonacci(n):", "import numpy as np\n\ndef normalize(x):", "class Stack:\n    def __init__(self):",
           "The capital of France is")


@dataclass
class ModelFigures:
    requests: int = 0
    errors: int = 0
    tokens: int = 0
    first_token_s: list[float] = field(default_factory=list)
    error_samples: list[str] = field(default_factory=list)

    def summary(self, seconds: float) -> dict:
        ttft = sorted(self.first_token_s)

        def pct(q: float) -> float | None:
            return round(ttft[min(len(ttft) - 1, int(q * len(ttft)))], 4) if ttft else None

        return {"requests": self.requests, "errors": self.errors, "tokens": self.tokens,
                "tokens_per_second": round(self.tokens / seconds, 3) if seconds > 0 else None,
                "ttft_p50_s": pct(0.5), "ttft_p95_s": pct(0.95), "error_samples": self.error_samples[:5]}


async def _client(index: int, client, models: list[str], deadline: float, max_tokens: int,
                  figures: dict[str, ModelFigures]) -> None:
    j = index
    while time.monotonic() < deadline:
        model = models[j % len(models)]
        prompt = PROMPTS[j % len(PROMPTS)]
        j += 1
        f = figures[model]
        f.requests += 1
        start = time.monotonic()
        first, finished = None, False
        try:
            stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                     temperature=0, stream=True)
            async for chunk in stream:
                if not chunk.choices:
                    continue
                if chunk.choices[0].text:
                    f.tokens += 1
                    if first is None:
                        first = time.monotonic() - start
                finished = finished or chunk.choices[0].finish_reason is not None
            if not finished:
                raise RuntimeError("the stream ended without a finish_reason")
            if first is not None:
                f.first_token_s.append(first)
        except Exception as exc:  # counted and sampled, never hidden
            f.errors += 1
            f.error_samples.append(f"{type(exc).__name__}: {str(exc)[:200]}")


async def run(url: str, models: list[str], clients: int = 16, seconds: float = 60.0, max_tokens: int = 32,
              timeout_s: float = 600.0) -> dict:
    """The figures of one run (per model, and the whole run's seconds)."""
    import openai

    figures = {m: ModelFigures() for m in models}
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=timeout_s) as client:
        start = time.monotonic()
        deadline = start + seconds
        await asyncio.gather(*(_client(i, client, models, deadline, max_tokens, figures) for i in range(clients)))
        elapsed = time.monotonic() - start
    return {"clients": clients, "seconds": round(elapsed, 2), "max_tokens": max_tokens,
            "models": {m: f.summary(elapsed) for m, f in figures.items()},
            "errors": sum(f.errors for f in figures.values())}


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the server's OpenAI base URL, ending in /v1")
    parser.add_argument("--models", required=True, help="comma-separated model ids (GET /v1/models)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--label", default="hartonomous", help="what the server is (the JSON's row name)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.max_tokens < 1:
        parser.error("--clients, --seconds and --max-tokens must be positive")
    before = os.getloadavg()
    report = asyncio.run(run(args.url, args.models.split(","), args.clients, args.seconds, args.max_tokens))
    report = {"label": args.label, "command": " ".join([sys.executable, *sys.argv]), "commit": _commit(),
              "cpus": os.cpu_count(), "loadavg_before": before, "loadavg_after": os.getloadavg(), **report}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
