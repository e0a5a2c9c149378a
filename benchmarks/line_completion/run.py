"""The systems side by side on the same lines, with the same in-file prompt.

- exact: the exact model alone;
- exact + retrieval: the same, its prompt prefixed with the retrieved chunks (retrieval.py);
- augmented: the exact model mixed with the repository's store by the store's gate;
- augmented + retrieval: the same on the retrieval prompt (model and store read the same ids:
  retrieved chunks inside the store's history window become history atoms);
- counting ⊕ exact: the ∞-gram of the store's own training text (alone or with the in-context
  cache, whichever fits the calibration split better) mixed with the exact model by a gate of the
  same family fitted there (hartonomous.compare.counting, as compare's path);
- spatial: the store's next_token alone, for the record.

Each writes greedily (temperature 0) until it has written one non-blank line after the prompt,
at most NEW_TOKENS tokens or EOS (prompts.line_done). Latency: wall time from the prompt to the
finished line, prefill included. Speculative decoding over exact gives exact's tokens, so only its
time is measured (and that its tokens are exact's).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from benchmarks.line_completion.prompts import NEW_TOKENS, LinePrompt, completed_line, line_done
from benchmarks.line_completion.metrics import edit_similarity, exact_match
from hartonomous.generation_config import SamplerArgs

GREEDY = SamplerArgs(temperature=0.0, top_k=None, top_p=1.0, repetition_penalty=1.0)
SYSTEMS = ("exact", "exact + retrieval", "augmented", "augmented + retrieval", "counting ⊕ exact", "spatial")
RETRIEVAL = {"exact + retrieval", "augmented + retrieval"}


@dataclass
class Completion:
    """One system's completion of one line."""

    system: str
    repo: str
    path: str
    line: int
    target: str
    predicted: str
    em: float
    es: float
    seconds: float
    tokens: int
    prompt_tokens: int
    weights: list = field(default_factory=list)     # augmented: λ per generated token

    def as_dict(self) -> dict:
        return asdict(self)


def greedy_line(backend, tokenizer, ids: list[int], new_tokens: int = NEW_TOKENS, state=None,
                prefill_seconds: float = 0.0) -> tuple[str, list[int], float, list]:
    """(text written, its token ids, seconds, λ per step where the backend has one) greedily until
    a line is done; from `state` when the prompt was prefilled already (its time in `prefill_seconds`,
    added to the seconds)."""
    start = time.perf_counter() - prefill_seconds
    state = backend.start(list(ids)) if state is None else state
    eos = backend.eos_token_ids()
    out: list[int] = []
    weights: list[float] = []
    text = ""
    while len(out) < new_tokens:
        token = int(backend.distribution(state, GREEDY).token_ids[0])
        weight = getattr(state, "weight", None)
        if weight is not None:
            weights.append(round(float(weight), 4))
        if token in eos:
            break
        out.append(token)
        text = tokenizer.decode(out)
        if line_done(text):
            break
        backend.advance(state, token)
    return text, out, time.perf_counter() - start, weights


class CountingExact:
    """(1 − λ) p_exact + λ p_count, λ from the counting gate (the backend protocol: start,
    distribution, advance)."""

    name = "counting ⊕ exact"

    def __init__(self, exact, counting, gate, window: int | None):
        self.exact, self.counting, self.gate, self.window = exact, counting, gate, window
        self.tokenizer = exact.tokenizer

    def eos_token_ids(self) -> set[int]:
        return self.exact.eos_token_ids()

    def start(self, ids: list[int]):
        return self.exact.start(ids)

    def advance(self, state, token: int) -> None:
        self.exact.advance(state, token)

    def distribution(self, state, sampler: SamplerArgs):
        from hartonomous.augment.mixture import mixed_probs
        from hartonomous.backends.exact import ordered_distribution
        from hartonomous.compare.counting import feature_row

        if state.logits is None:
            state.logits = self.exact.score_logits(state, [])[0]
        logits = state.logits
        probs = torch.softmax(logits.detach().to(torch.float64), -1)
        step = self.counting.step(state.ids)
        lam = 0.0
        if len(step.dist):
            row = feature_row(step, probs.cpu().numpy(), self.window)
            lam = float(self.gate.weights(row[None])[0])
        state.weight = lam                      # read by greedy_line, as the augmented state's
        ids = [int(i) for i in step.dist.ids] if len(step.dist) else []
        values = [float(p) for p in step.dist.probs] if len(step.dist) else []
        return ordered_distribution(mixed_probs(logits, ids, values, lam, state.ids, sampler, exact_probs=probs))


def counting_system(info, model, tokenizer, exact_backend) -> tuple[CountingExact, dict]:
    """counting ⊕ exact for a store: its training text's ∞-gram (corpus labels, the build's chunks),
    alone and with the in-context cache (compare's defaults), the better one on the calibration split."""
    from hartonomous.compare import cache, labels as labels_mod
    from hartonomous.compare.baselines import build_tokens, context_length, recorded_corpus
    from hartonomous.compare.counting import CountingModel
    from hartonomous.compare.infinigram import InfiniGram
    from hartonomous.compare.real_text import calibration_texts, fit_counting
    from hartonomous.corpus import teacher
    from hartonomous.corpus.sources import chunk_ids, tokenize

    started = time.perf_counter()
    text = recorded_corpus(info).text
    ids = tokenize(tokenizer, text)[0][:build_tokens(info)]
    length = min(context_length(info), teacher.max_context(model))
    index = InfiniGram(labels_mod.from_corpus(chunk_ids(ids, length)))
    cached = cache.CachedNGram(index.predict, cache.DEFAULT_LAMBDA, cache.DEFAULT_MIN_SUFFIX)
    models = {"∞-gram": CountingModel("∞-gram", index), "∞-gram + cache": CountingModel("∞-gram + cache", index, cached)}
    name, gate, candidates = fit_counting(models, calibration_texts(info, model, tokenizer, length),
                                          info.centroid_window)
    return (CountingExact(exact_backend, models[name], gate, info.centroid_window),
            {"model": name, "candidates": candidates, "tokens": int(len(ids)),
             "seconds": round(time.perf_counter() - started, 1)})


def score(system: str, repo: str, prompt: LinePrompt, text: str, tokens: list[int], seconds: float,
          prompt_tokens: int, weights: list | None = None) -> Completion:
    predicted = completed_line(text)
    return Completion(system, repo, prompt.path, prompt.line, prompt.target, predicted,
                      exact_match(predicted, prompt.target), edit_similarity(predicted, prompt.target),
                      round(seconds, 4), len(tokens), prompt_tokens, weights or [])


def fork(state):
    """A copy of a prefilled exact state (its KV cache copied) that decodes on its own."""
    import copy

    from hartonomous.backends.exact import ExactState

    return ExactState(list(state.ids), copy.deepcopy(state.cache), state.logits.clone())


def starting_state(backend, exact_state):
    """The backend's state over an exact state already prefilled with its prompt."""
    from hartonomous.augment.backend import AugmentedBackend, AugmentedState

    return AugmentedState(exact_state) if isinstance(backend, AugmentedBackend) else exact_state


def prefill(exact_backend, ids: list[int]) -> tuple[object, float]:
    start = time.perf_counter()
    state = exact_backend.start(list(ids))
    return state, time.perf_counter() - start


def run_line(backends: dict, tokenizer, repo: str, prompt: LinePrompt, retrieved_ids: list[int] | None,
             speculative=None, exact_backend=None) -> tuple[list[Completion], dict | None, object]:
    """Every system in `backends` on one line; with `speculative` (an engine over exact), its time
    for exact's tokens and whether they were the same. The systems that run the exact model share
    one prefill of each prompt (`exact_backend`'s; each decodes from its own copy of the KV cache,
    and its seconds include the prefill's). Returns the plain prompt's prefilled state too."""
    out, exact_tokens = [], None
    prompts = {"plain": prompt.ids, "retrieval": retrieved_ids}
    prefilled = {}
    if exact_backend is not None:
        for key, ids in prompts.items():
            if ids is not None and any((s in RETRIEVAL) == (key == "retrieval") for s in backends if s != "spatial"):
                prefilled[key] = prefill(exact_backend, ids)
    for system, backend in backends.items():
        key = "retrieval" if system in RETRIEVAL else "plain"
        ids = prompts[key]
        if ids is None:
            continue
        state, seconds_before = None, 0.0
        if system != "spatial" and key in prefilled:
            state = starting_state(backend, fork(prefilled[key][0]))
            seconds_before = prefilled[key][1]
        text, tokens, seconds, weights = greedy_line(backend, tokenizer, ids, state=state,
                                                     prefill_seconds=seconds_before)
        out.append(score(system, repo, prompt, text, tokens, seconds, len(ids), weights))
        if system == "exact":
            exact_tokens = tokens
    timed = None
    if speculative is not None and exact_tokens:
        from hartonomous.generation_config import GenerationConfig

        start = time.perf_counter()
        result = speculative.generate(list(prompt.ids), GenerationConfig(max_new_tokens=len(exact_tokens),
                                                                        temperature=0.0, stop_at_eos=False))
        timed = {"seconds": round(time.perf_counter() - start, 4), "tokens": len(exact_tokens),
                 "identical": [int(t) for t in result.token_ids] == exact_tokens}
    return out, timed, prefilled.get("plain", (None, 0.0))[0]


def summary_weights(completions: list[Completion]) -> dict:
    """Where the store's weight goes inside a line: mean λ at the line's first generated token,
    the second, and the rest."""
    first, second, rest = [], [], []
    for c in completions:
        if c.weights:
            first.append(c.weights[0])
            second += c.weights[1:2]
            rest += c.weights[2:]
    mean = lambda v: float(np.mean(v)) if v else None  # noqa: E731
    return {"first_token": mean(first), "second_token": mean(second), "rest": mean(rest)}
