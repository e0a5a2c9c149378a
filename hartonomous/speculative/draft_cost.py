"""Draft lengths shaped by what a forward costs on this machine (issue 25).

A speculative round that drafts k tokens feeds the exact model k tokens (the token still pending
plus the first k - 1 drafted; the last drafted token is judged from the logits before it) and
yields, with a per-token acceptance rate a, E(k) = 1 + a + ... + a^(k-1) = (1 - a^k) / (1 - a)
tokens: the kept prefix, then the exact model's correction. A plain step (k = 0) feeds one token
and yields one. On a CPU the cost of a forward is not linear in the tokens fed (SmolLM2 on 2 cores,
median of 10 after a 128-token prefix: 40 ms for 1 token, 64 for 2, 81 for 3, 63 for 4, 61 for 8):
a fixed schedule that shrinks drafts after rejections lands on 2-3 tokens, the costliest shape per
token. So the policy measures the forward cost c(n) for n = 1..MAX_MEASURED tokens once, at
start-up (`measure_forward_costs`), keeps a running acceptance rate and a running draft-call time
d, and each round picks

    k* = argmax over k in {0} ∪ {2..K} of  E(k) / (c(k) + d)      (k = 0: 1 / c(1))

(k = 1 is never better than a plain step: it costs a forward of one token and a database call and
yields one token). While k* = 0 the rounds are plain, and after PROBE_EVERY of them one round drafts
the best k > 0 anyway, so that a rate learnt on a bad stretch can recover; each probe that does not
bring drafting back doubles the plain rounds before the next (up to MAX_PROBE_EVERY), so a text the
drafter cannot predict costs a few probes, not one every nine rounds.

Trees (`max_width` > 1): a round may draft a tree of w branches of depth k (SQL `draft_tree`: the
w most likely first tokens, each continued greedily), verified in one forward of 1 + w (k - 1)
tokens. Its first token is kept when the exact model's token (the argmax at T = 0, a draw from p
at T > 0; hartonomous/speculative/decoding.py) is among the w first tokens,
with running probability p1(w) (per width, counted over the rounds that drafted at least that
wide, shrunk towards a prior, and never below p1(w - 1)); the later ones with the running rate a.
A round then yields E(k, w) = p1(w) E(k) + 1 - p1(w) a^(k-1) tokens (w = 1 with p1 = a is the chain's
E(k)), and the policy takes the (k, w) with the most E(k, w) / (c(1 + w (k - 1)) + d(w)), d(w) the
running draft-call time of width w.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

MAX_MEASURED = 16            # forward costs measured for 1..16 tokens
MEASURE_PREFIX = 128         # tokens cached before the timed forwards (a realistic KV-cache length)
MEASURE_REPEATS = 3          # timed forwards per length (the median is kept), after one warm-up
PRIOR_ACCEPTANCE = 0.5       # the rate before anything is judged, worth PRIOR_WEIGHT judged tokens
PRIOR_WEIGHT = 4
ACCEPTANCE_WINDOW = 32       # judged draft tokens the running rate looks at
DRAFT_SECONDS_PRIOR = 0.003  # a draft call before one is timed (PL/pgSQL backoff sets: ~3 ms)
PROBE_EVERY = 8              # plain rounds before the first probe while drafting does not pay
MAX_PROBE_EVERY = 64         # ... doubled after each probe that did not bring drafting back, up to this
WIDER_PRIOR_GAIN = 0.25      # prior: one more first candidate catches this share of the misses left
_MEASURING = threading.Lock()  # concurrent first requests measure once, not side by side
CACHE_VERSION = 2            # bump when what is measured (or how) changes


@dataclass(frozen=True)
class ForwardCosts:
    """Seconds of one cached forward of n new tokens, n = 1..len(seconds), measured on this machine."""

    seconds: tuple[float, ...]
    prefix: int = MEASURE_PREFIX

    def of(self, n: int) -> float:
        """c(n); beyond the measured range the cost grows linearly from the last two points."""
        if n <= len(self.seconds):
            return self.seconds[n - 1]
        last, before = self.seconds[-1], self.seconds[-2] if len(self.seconds) > 1 else 0.0
        return last + (n - len(self.seconds)) * max(last - before, 0.0)

    def as_dict(self) -> dict:
        return {"prefix": self.prefix, "ms": [round(s * 1000, 3) for s in self.seconds]}


def forward_costs(model, cache_dir: Path | None = None) -> ForwardCosts:
    """The model's forward costs, measured on first use and kept on the model object (a server
    measures once, whatever the number of requests; concurrent first requests wait for one
    measurement rather than timing each other's forwards). With `cache_dir` they are also kept on
    disk per runtime and CPU (`cost_key`), so a new process (a CLI call) reads them instead of
    spending seconds measuring; a missing, corrupt or foreign file is measured again and rewritten.
    Costs measured on a busy machine (`machine_is_busy`) are not written."""
    known = getattr(model, "_hartonomous_forward_costs", None)
    if known is not None:
        return known
    with _MEASURING:
        known = getattr(model, "_hartonomous_forward_costs", None)
        if known is None:
            key = cost_key(model) if cache_dir is not None else None
            known = _load(Path(cache_dir), key) if key is not None else None
            if known is None:
                busy = machine_is_busy()
                known = measure_forward_costs(model)
                if key is not None and not (busy or machine_is_busy()):
                    _save(Path(cache_dir), key, known)
            model._hartonomous_forward_costs = known
    return known


def machine_is_busy() -> bool:
    """Whether other work would slow a measurement: the 1-minute load average above the core count.
    Costs measured then serve this process only; they are not kept on disk for the next ones."""
    try:
        return os.getloadavg()[0] > (os.cpu_count() or 1)
    except OSError:
        return False


def costs_cache_dir(home: Path) -> Path:
    """Where measured forward costs live under a Hartonomous home ($HARTONOMOUS_HOME)."""
    return Path(home).expanduser() / "cache" / "forward-costs"


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; platform's words elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def architecture_fingerprint(torch_model) -> str:
    """sha256 over the model class, its attention implementation and every parameter's name,
    dtype and shape: what a forward's cost depends on (the weights' values do not change it, and
    hashing 0.5 GB of them would cost seconds of its own)."""
    digest = hashlib.sha256(type(torch_model).__name__.encode())
    digest.update(str(getattr(torch_model.config, "_attn_implementation", None)).encode())
    for name, tensor in sorted(torch_model.state_dict().items()):
        digest.update(f"|{name}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
    return digest.hexdigest()


def cost_key(model) -> dict:
    """What the measured costs of `model` (hartonomous.runtimes.reference.ExactModel) depend on; any change
    measures again."""
    import torch

    fingerprint = hashlib.sha256(model.fingerprint().encode()).hexdigest()
    return {"version": CACHE_VERSION, "model": fingerprint, "runtime": model.runtime, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "device": str(model.device), "cpu": cpu_name(),
            "max_tokens": MAX_MEASURED, "prefix": MEASURE_PREFIX, "repeats": MEASURE_REPEATS}


def _cache_file(cache_dir: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return cache_dir / f"{key['model'][:16]}-{digest[:16]}.json"


def _load(cache_dir: Path, key: dict) -> ForwardCosts | None:
    """The stored costs for `key`, or None when there are none or the file is not a valid entry."""
    try:
        stored = json.loads(_cache_file(cache_dir, key).read_text(encoding="utf-8"))
        seconds = tuple(float(s) for s in stored["seconds"])
        if stored["key"] != key or len(seconds) != key["max_tokens"] or not all(0 < s < 3600 for s in seconds):
            return None
        return ForwardCosts(seconds, int(stored["prefix"]))
    except (OSError, ValueError, TypeError, KeyError):
        return None


def _save(cache_dir: Path, key: dict, costs: ForwardCosts) -> None:
    """Write the entry atomically (a temporary file renamed over it); a read-only home is not an error."""
    path = _cache_file(cache_dir, key)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "prefix": costs.prefix, "seconds": list(costs.seconds)}, indent=1),
                       encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass


def measure_forward_costs(model, max_tokens: int = MAX_MEASURED, prefix: int = MEASURE_PREFIX,
                          repeats: int = MEASURE_REPEATS) -> ForwardCosts:
    """Time `model` (hartonomous.runtimes.reference.ExactModel) feeding n = 1..max_tokens tokens after a cached
    prefix, the logits of every fed position kept (as verification keeps them); the median of
    `repeats` passes over n = 1..max_tokens after one warm-up pass, the cache cropped back after each."""
    import torch

    with torch.inference_mode():
        return _measure(model, max_tokens, prefix, repeats)


def _measure(model, max_tokens: int, prefix: int, repeats: int) -> ForwardCosts:
    ids = [i % model.vocab_size for i in range(1000, 1000 + prefix + max_tokens)]
    cache = model.new_cache()
    model.prefill(ids[:prefix], cache)
    runs: list[list[float]] = [[] for _ in range(max_tokens)]
    for attempt in range(repeats + 1):            # lengths interleaved: a burst of other work on the
        for n in range(1, max_tokens + 1):        # machine slows every length a little, not a few a lot
            t0 = time.perf_counter()
            model.extend(ids[prefix:prefix + n], cache, n)
            elapsed = time.perf_counter() - t0
            cache.crop(prefix)
            if attempt:
                runs[n - 1].append(elapsed)
    return ForwardCosts(tuple(statistics.median(r) for r in runs), prefix)


def expected_tokens(k: int, acceptance: float) -> float:
    """E(k): tokens a round drafting k yields at per-token acceptance `acceptance` (1 for k = 0)."""
    if k == 0:
        return 1.0
    if acceptance >= 1.0:
        return float(k)
    return (1.0 - acceptance ** k) / (1.0 - acceptance)


class CostShapedPolicy:
    """Draft lengths from the forward costs, the running acceptance and the draft call's time."""

    def __init__(self, costs: ForwardCosts, max_draft_tokens: int, min_draft: int = 0, max_width: int = 1):
        if max_width < 1:
            raise ValueError(f"max_width must be at least 1, got {max_width}")
        self.costs = costs
        self.max_width = max_width            # > 1: trees of up to this many branches
        self.width = 1                        # the width of the round `length` last shaped
        self.first_hits = {w: deque(maxlen=ACCEPTANCE_WINDOW) for w in range(1, max_width + 1)}
        self.width_seconds: dict[int, float] = {}
        self.min_draft = min_draft          # 1 at T > 0: a "plain" round still judges a 1-token draft
        self.max_draft_tokens = max_draft_tokens
        self.recent: deque[bool] = deque(maxlen=ACCEPTANCE_WINDOW)
        self.draft_seconds = DRAFT_SECONDS_PRIOR
        self.plain_rounds = 0
        self.probe_every = PROBE_EVERY        # plain rounds before the next probe

    @property
    def acceptance(self) -> float:
        """The running per-token acceptance, shrunk towards PRIOR_ACCEPTANCE while few are judged."""
        return (sum(self.recent) + PRIOR_ACCEPTANCE * PRIOR_WEIGHT) / (len(self.recent) + PRIOR_WEIGHT)

    def rate(self, k: int) -> float:
        """Tokens per second of a round drafting k (0: a plain step)."""
        if k == 0:
            return 1.0 / (self.costs.of(1) + (self.draft_seconds if self.min_draft else 0.0))
        return expected_tokens(k, self.acceptance) / (self.costs.of(k) + self.draft_seconds)

    def first_acceptance(self, width: int) -> float:
        """p1(width): how often the exact argmax is among the first `width` drafted first tokens."""
        p = PRIOR_ACCEPTANCE
        for w in range(1, width + 1):
            prior = PRIOR_ACCEPTANCE if w == 1 else p + (1.0 - p) * WIDER_PRIOR_GAIN
            hits = self.first_hits[w]
            estimate = (sum(hits) + prior * PRIOR_WEIGHT) / (len(hits) + PRIOR_WEIGHT)
            p = estimate if w == 1 else max(p, estimate)
        return p

    def tree_rate(self, k: int, width: int) -> float:
        """Tokens per second of a round drafting `width` branches of k tokens (a tree; k >= 1)."""
        a, p1 = self.acceptance, self.first_acceptance(width)
        tokens = p1 * expected_tokens(k, a) + 1.0 - p1 * a ** (k - 1)
        seconds = self.width_seconds.get(width, self.draft_seconds * width)
        return tokens / (self.costs.of(1 + width * (k - 1)) + seconds)

    def best_draft(self, left: int) -> int:
        """The k in 2..min(K, left) (or 1 when only 1 is left) with the highest rate."""
        top = max(1, min(self.max_draft_tokens, left))
        candidates = range(2, top + 1) if top >= 2 else [1]
        if self.max_width == 1:
            return max(candidates, key=self.rate)
        k, self.width = max(((k, w) for k in candidates for w in range(1, self.max_width + 1)),
                            key=lambda shape: self.tree_rate(*shape))
        return k

    def _best_rate(self, k: int) -> float:
        return self.rate(k) if self.max_width == 1 else self.tree_rate(k, self.width)

    def length(self, left: int) -> int:
        """The next round's draft length (0: a plain step); `width` is then its tree's width."""
        self.width = 1
        k = self.best_draft(left)
        if self._best_rate(k) > self.rate(0):
            self.plain_rounds, self.probe_every = 0, PROBE_EVERY
            return k
        self.plain_rounds += 1
        if self.plain_rounds > self.probe_every:  # a probe: the rate may have been learnt on a bad stretch
            self.plain_rounds = 0
            self.probe_every = min(2 * self.probe_every, MAX_PROBE_EVERY)   # until drafting pays again
            return k
        self.width = 1
        return min(self.min_draft, left)

    def update(self, asked: int, drafted: int, accepted: int, draft_seconds: float | None = None) -> None:
        """Account for a round that asked for `asked` tokens, got `drafted`, kept `accepted`; the
        tokens after a rejection were not judged. A 1-token round teaches nothing about longer drafts'
        worth beyond its one judged token, which is counted like any other."""
        if asked == 0:
            return
        judged = accepted + (1 if accepted < drafted else 0)
        self.recent.extend([True] * accepted + [False] * (judged - accepted))
        if accepted or drafted:
            self.first_hits[1].append(accepted > 0)
        if draft_seconds is not None:
            self.draft_seconds = 0.8 * self.draft_seconds + 0.2 * draft_seconds
            self.width_seconds[1] = self.draft_seconds

    def can_warm(self, sampler) -> bool:
        """Always: at T = 0 every kept token is the argmax, and at T > 0 its plain rounds still judge a
        draft (chains) or every position is a draw from p (trees), so no length changes the sample."""
        return True

    def learned(self) -> dict:
        """What this run learned, as an immutable snapshot (hartonomous/speculative/learned.py): the
        judged windows and the draft-call times; not the probe schedule, which restarts per run."""
        return {"recent": tuple(self.recent), "first_hits": {w: tuple(h) for w, h in self.first_hits.items()},
                "draft_seconds": self.draft_seconds, "width_seconds": dict(self.width_seconds)}

    def warm(self, state: dict) -> None:
        """Start from an earlier run's snapshot (widths beyond this policy's are left out)."""
        self.recent.extend(state.get("recent", ()))
        for w, hits in state.get("first_hits", {}).items():
            if w in self.first_hits:
                self.first_hits[w].extend(hits)
        self.draft_seconds = float(state.get("draft_seconds", self.draft_seconds))
        self.width_seconds.update({w: s for w, s in state.get("width_seconds", {}).items() if w <= self.max_width})

    def update_tree(self, width: int, rank: int | None, later: list[bool], draft_seconds: float) -> None:
        """Account for a tree round of `width` branches: the exact argmax was first token number `rank`
        (1-based; None: not among them), and `later` judges the chosen branch's following tokens."""
        for w in range(1, width + 1):
            self.first_hits[w].append(rank is not None and rank <= w)
        self.recent.extend(later)
        known = self.width_seconds.get(width, draft_seconds)
        self.width_seconds[width] = 0.8 * known + 0.2 * draft_seconds
