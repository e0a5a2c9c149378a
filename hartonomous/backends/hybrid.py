"""Confidence-routed hybrid generation (issue 16): each step from the spatial path when the atom set's
predicted risk is below a threshold, else from the exact model.

Per step the spatial path's signals (SQL next_token_signals) give the risk r, the probability that
the spatial top-1 differs from the exact model's (hartonomous/risk.py). r < threshold: the step's
distribution is `next_token`'s; otherwise the exact model's. threshold 0 sends every step to the
exact model and any threshold above 1 (a risk is a probability) every step to the spatial path,
without computing a risk (so they are exactly those paths); one knob trades speed for fidelity in
between.

The exact model's KV cache follows every accepted token. After an exact step the token is decoded
at once (`ExactBackend.advance`, as on the exact path); tokens taken from the spatial path are
appended to the exact state without a forward and fed together, in one cached forward, when the
exact model is next asked (`ExactBackend.score_logits` feeds the ids not yet cached). So a run of
spatial steps costs no transformer work, and the exact model always sees the whole text.
The engine picks the token from either distribution with the same seeded uniforms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hartonomous.backends.base import Distribution
from hartonomous.backends.exact import ExactBackend, ExactState
from hartonomous.backends.spatial import SpatialBackend, SpatialState
from hartonomous.errors import UserError
from hartonomous.generation_config import SamplerArgs
from hartonomous.paths.options import PathOptions, check_threshold
from hartonomous.signals import StepSignals


@dataclass
class HybridStats:
    """How the steps were routed, and the risks seen."""

    threshold: float
    steps: int = 0
    exact_steps: int = 0
    risks: list[float] = field(default_factory=list)

    @property
    def exact_fraction(self) -> float:
        return self.exact_steps / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        return {"threshold": self.threshold, "steps": self.steps, "exact_steps": self.exact_steps,
                "exact_fraction": self.exact_fraction}


@dataclass
class HybridState:
    spatial: SpatialState
    exact: ExactState
    stats: HybridStats
    route: str | None = None                 # the path that answered the current step
    step_signals: StepSignals | None = None  # the current step's spatial signals (None: not computed)


class HybridBackend:
    """Routes each step to the spatial or the exact backend by the predicted risk."""

    name = "hybrid"

    def __init__(self, spatial: SpatialBackend, exact: ExactBackend,
                 risk_threshold: float = PathOptions.risk_threshold):
        self.spatial, self.exact = spatial, exact
        self.threshold = check_threshold(risk_threshold)
        self.tokenizer = exact.tokenizer

    @property
    def atom_set_name(self) -> str:
        return self.spatial.atom_set_name

    def eos_token_ids(self) -> set[int]:
        return self.exact.eos_token_ids()

    def start(self, prompt_ids: list[int]) -> HybridState:
        exact = self.exact.start(prompt_ids) if self.threshold <= 1 else self.exact.begin(prompt_ids)
        return HybridState(self.spatial.start(prompt_ids), exact, HybridStats(self.threshold))

    def signals(self, state: HybridState) -> StepSignals:
        """The spatial signals of the current step (computed once per step)."""
        if state.step_signals is None:
            state.step_signals = self.spatial.signals(state.spatial)
        return state.step_signals

    def route(self, state: HybridState) -> str:
        if self.threshold == 0:
            return "exact"
        if self.threshold > 1:                   # a risk is a probability: every step is below
            return "spatial"
        risk = self.signals(state).risk
        if risk is None:
            raise UserError(f"atom set '{self.spatial.atom_set_name}' has no risk predictor, which the hybrid "
                            "path needs at a threshold in (0, 1]; rebuild it with `hartonomous build`")
        state.stats.risks.append(risk)
        return "spatial" if risk < self.threshold else "exact"

    def distribution(self, state: HybridState, sampler: SamplerArgs) -> Distribution:
        state.route = self.route(state)
        state.stats.steps += 1
        if state.route == "exact":
            state.stats.exact_steps += 1
            return self.exact.distribution(state.exact, sampler)
        return self.spatial.distribution(state.spatial, sampler)

    def advance(self, state: HybridState, token_id: int) -> None:
        self.spatial.advance(state.spatial, token_id)
        if state.route == "spatial":
            state.exact.logits = None            # stale: the token is fed with the next exact step
        self.exact.advance(state.exact, token_id)
        state.step_signals = None

    def close(self) -> None:
        self.spatial.close()
        self.exact.close()
