"""Load a running Hartonomous server: N concurrent clients, mixed next_token and generate, for T seconds.

    python -m hartonomous.reliability.load --url http://127.0.0.1:8000 --clients 16 --seconds 60 \\
        [--database-url postgresql://owner@.../hartonomous --application-name <server's>]

Each client is a thread with its own keep-alive HTTP connection that sends requests back to
back: next_token, generate (engine loop, one SQL next_token per step), generate with
`in_database` (SQL generate_tokens) and generate on the speculative path (the server's exact model
verifying drafts of `draft_tokens`, lengths from its measured forward costs), in turn. Every answer is checked (status 200, a
distribution that sums to 1, the number of tokens asked for); anything else counts as an error.
A warm-up (default 5 s: the pool opening its connections, statements being prepared) runs
first; its errors count, its latencies and requests do not.
Prints requests/s, tokens/s, p50/p99 latency per kind and, with --database-url, the server's
database connections before, during (max) and after the run.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field

import httpx

from hartonomous.measure import checkout, host, load_average, percentile

KINDS = ("next_token", "generate", "generate_in_database", "generate_speculative")
PROMPTS = ("The capital of France is", "def add(a, b):", "Return the sum of the numbers",
           "héllo wörld 東京 🙂", "Raise ValueError if the list is empty.")


@dataclass
class LoadReport:
    """What one load run did; latencies in milliseconds."""

    clients: int
    seconds: float
    warmup_seconds: float
    requests: int
    errors: int
    error_samples: list[str]
    requests_per_second: float
    tokens_per_second: float
    p50_ms: float | None                  # None: no request finished in the measured time
    p99_ms: float | None
    by_kind: dict[str, dict[str, float | None]]
    connections: dict[str, int] = field(default_factory=dict)
    memory: dict = field(default_factory=dict)       # the server's memory of past generations, when remembering
    machine: dict = field(default_factory=dict)      # measure.host(), the load average before the run, the commit

    def as_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        """A short human-readable summary."""
        out = [f"{self.clients} clients for {self.seconds:.1f} s (after {self.warmup_seconds:g} s of warm-up): "
               f"{self.requests} requests, {self.errors} errors",
               f"throughput {self.requests_per_second:.1f} requests/s, {self.tokens_per_second:.1f} generated "
               f"tokens/s; latency p50 {_ms(self.p50_ms)} ms, p99 {_ms(self.p99_ms)} ms"]
        for kind, s in self.by_kind.items():
            out.append(f"  {kind:22s} {int(s['requests']):6d} requests  p50 {_ms(s['p50_ms']):>8} ms  "
                       f"p99 {_ms(s['p99_ms']):>8} ms")
        if self.connections:
            out.append("database connections: " + ", ".join(f"{k} {v}" for k, v in self.connections.items()))
        if self.machine:
            out.append(f"machine: {self.machine.get('cores')} cores, load average {self.machine.get('load_average_before')} "
                       f"before, {self.machine.get('load_average')} after")
        if self.memory:
            out.append("memory: " + ", ".join(f"{k} {v}" for k, v in self.memory.items()))
        out.extend(f"  error: {e}" for e in self.error_samples)
        return out


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _request(kind: str, i: int, max_new_tokens: int) -> tuple[str, dict]:
    prompt = PROMPTS[i % len(PROMPTS)]
    if kind == "next_token":
        return "/api/next_token", {"prompt": prompt, "limit": 1000, "top_k": 0, "top_p": 1.0}
    body = {"prompt": prompt, "seed": i, "max_new_tokens": max_new_tokens, "ignore_eos": True,
            "in_database": kind == "generate_in_database"}
    if kind == "generate_speculative":       # the exact model verifies spatial drafts (cost-shaped lengths)
        body["path"] = "speculative"
    return "/api/generate", body


def _check(kind: str, response: httpx.Response, max_new_tokens: int) -> tuple[str | None, int]:
    """(an error description or None, tokens generated)."""
    if response.status_code != 200:
        return f"{kind}: HTTP {response.status_code} {response.text[:200]}", 0
    payload = response.json()
    if kind == "next_token":
        total = sum(r["probability"] for r in payload["rows"])
        if not payload["rows"] or payload["total_rows"] != len(payload["rows"]) or abs(total - 1) > 1e-9:
            return f"next_token: not a distribution (rows {len(payload['rows'])}, sum {total!r})", 0
        return None, 0
    tokens = len(payload["token_ids"])
    if tokens != max_new_tokens and payload["finish_reason"] != "no_candidates":
        return f"{kind}: {tokens} tokens, finish_reason {payload['finish_reason']}", tokens
    return None, tokens


class _Client(threading.Thread):
    def __init__(self, index: int, url: str, measure_from: float, deadline: float, max_new_tokens: int,
                 timeout_s: float):
        super().__init__(daemon=True, name=f"load-client-{index}")
        self.index, self.url, self.measure_from, self.deadline = index, url, measure_from, deadline
        self.max_new_tokens, self.timeout_s = max_new_tokens, timeout_s
        self.latencies: dict[str, list[float]] = {k: [] for k in KINDS}
        self.errors: list[str] = []
        self.tokens = 0

    def run(self) -> None:
        n = self.index
        with httpx.Client(base_url=self.url, timeout=self.timeout_s) as http:
            while time.monotonic() < self.deadline:
                kind = KINDS[n % len(KINDS)]
                path, body = _request(kind, n, self.max_new_tokens)
                measured = time.monotonic() >= self.measure_from
                started = time.perf_counter()
                try:
                    response = http.post(path, json=body)
                    error, tokens = _check(kind, response, self.max_new_tokens)
                except Exception as exc:     # any failure is counted, never hidden, and the client goes on
                    error, tokens = f"{kind}: {type(exc).__name__}: {exc}", 0
                if measured:
                    self.latencies[kind].append((time.perf_counter() - started) * 1000)
                    self.tokens += tokens
                if error:
                    self.errors.append(error)
                n += len(KINDS) * 7 + 1          # the next kind in turn, another prompt and seed


def run_load(url: str, clients: int = 16, seconds: float = 60.0, max_new_tokens: int = 8,
             warmup_s: float = 5.0, timeout_s: float = 120.0) -> LoadReport:
    """Run `clients` threads against the server at `url` for `warmup_s` + `seconds`; what happened."""
    load_before = load_average()           # other work on the machine moves the figures: record it
    measure_from = time.monotonic() + warmup_s
    workers = [_Client(i, url, measure_from, measure_from + seconds, max_new_tokens, timeout_s)
               for i in range(clients)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.monotonic() - measure_from
    all_ms = [x for w in workers for per in w.latencies.values() for x in per]
    errors = [e for w in workers for e in w.errors]
    by_kind = {}
    for kind in KINDS:
        ms = [x for w in workers for x in w.latencies[kind]]
        by_kind[kind] = {"requests": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}
    common = Counter(errors).most_common(5)
    return LoadReport(clients=clients, seconds=elapsed, warmup_seconds=warmup_s, requests=len(all_ms),
                      errors=len(errors),
                      error_samples=[f"{n} x {e}" for e, n in common],
                      requests_per_second=len(all_ms) / elapsed, tokens_per_second=sum(w.tokens for w in workers)
                      / elapsed, p50_ms=percentile(all_ms, 50), p99_ms=percentile(all_ms, 99), by_kind=by_kind,
                      machine={**host(), "load_average_before": load_before, **checkout(),
                               "date": time.strftime("%Y-%m-%d", time.gmtime())})


# -- database connections ---------------------------------------------------------------------------

def connection_counts(database_url: str, application_name: str | None = None) -> dict[str, int]:
    """Client backends on the server: all of them, and those of `application_name` by state."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True, connect_timeout=10) as conn:
        rows = conn.execute(
            "SELECT application_name, coalesce(state, 'unknown'), count(*) FROM pg_stat_activity "
            "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() GROUP BY 1, 2").fetchall()
    counts = {"all": sum(r[2] for r in rows)}
    if application_name is not None:
        mine = [r for r in rows if r[0] == application_name]
        counts["server"] = sum(r[2] for r in mine)
        for _, state, n in mine:
            counts[f"server_{state.replace(' ', '_')}"] = n
    return counts


class ConnectionSampler(threading.Thread):
    """Samples the server's connection count once a second; `peak` is the largest seen."""

    def __init__(self, database_url: str, application_name: str, interval_s: float = 1.0):
        super().__init__(daemon=True, name="connection-sampler")
        self.database_url, self.application_name, self.interval_s = database_url, application_name, interval_s
        self.peak = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            self.peak = max(self.peak, connection_counts(self.database_url, self.application_name)["server"])

    def stop(self) -> int:
        self._halt.set()
        self.join(timeout=30)
        return self.peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="The server's base URL.")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0, help="Measured seconds (after the warm-up).")
    parser.add_argument("--warmup", type=float, default=5.0, help="Seconds of load before measuring.")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--database-url", help="Owner URL, to count the server's connections (optional).")
    parser.add_argument("--application-name", help="The server's application_name in pg_stat_activity.")
    parser.add_argument("--json", action="store_true", help="Print the report as JSON.")
    args = parser.parse_args(argv)
    before = sampler = None
    if args.database_url:
        before = connection_counts(args.database_url, args.application_name)
        if args.application_name:
            sampler = ConnectionSampler(args.database_url, args.application_name)
            sampler.start()
    report = run_load(args.url, args.clients, args.seconds, args.max_new_tokens, args.warmup)
    if args.database_url:
        after = connection_counts(args.database_url, args.application_name)
        report.connections = {"all_before": before["all"], "all_after": after["all"]}
        if sampler is not None:
            report.connections.update(server_before=before["server"], server_peak=sampler.stop(),
                                      server_after=after["server"])
    print(json.dumps(report.as_dict(), indent=2) if args.json else "\n".join(report.lines()))
    return 1 if report.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
