"""The options of a generation and the sampler settings every path shares, with their rules.

`GenerationConfig` is the one home of the sampler defaults and of the input rules of a
generation (the SQL functions check the same rules); callers (CLI, HTTP, client) take their
defaults from it and only translate its `InvalidArgument` errors. `SamplerArgs` is what a
backend and the SQL calls receive (`config.sampler`).

Part of the runtime core: the engine, the backends, `sqlcalls` and `adaptive` import it, and it
imports none of them (tests/test_layering.py). torch is not loaded here: `hartonomous.sampling`
is imported where the sampler arguments are checked, so the CLI reads the defaults cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hartonomous.errors import InvalidArgument

MAX_NEW_TOKENS = 4096          # the upper bound of max_new_tokens; SQL generate_tokens enforces the same
MAX_SEED = 2**63 - 1
SAMPLER_FIELDS = ("temperature", "top_k", "top_p", "repetition_penalty")
CAUTIOUS_MODES = ("flatten", "signal", "abstain")    # adaptive sampling's cautious steps (hartonomous/adaptive.py)


@dataclass(frozen=True)
class SamplerArgs:
    """The sampler settings every path shares (docs/design.md, 'Sampler semantics').

    No defaults here: they live in `GenerationConfig`, whose `.sampler` builds this object.
    """

    temperature: float
    top_k: int | None
    top_p: float
    repetition_penalty: float


@dataclass(frozen=True)
class GenerationConfig:
    """Options of one generation, validated on construction (InvalidArgument naming the option).

    The one home of the defaults: SQL next_token's defaults equal the sampler's here, and the
    CLI, the HTTP schemas and the client read theirs from this class.
    """

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int | None = 40
    top_p: float = 0.9
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    stop_at_eos: bool = True
    signals: bool = False              # attach each step's signals (StepSignals) to its event
    sources: bool = False              # speculative: each kept draft's event says where it came from
    cite: bool = False                 # store-picked tokens' events carry their files and lines (hartonomous/repository/citations.py)
    adaptive: bool = False             # risk-scored adaptive sampling (hartonomous/adaptive.py)
    standard_p: float = 0.9
    explore_p: float = 0.95
    explore_temp: float = 1.2
    cautious_mode: str = "flatten"     # flatten | signal | abstain
    explore_risk: float = 0.5          # risk from which a step explores
    cautious_risk: float = 0.8         # risk from which a step is cautious

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids or ()))
        object.__setattr__(self, "stop_strings", tuple(s for s in self.stop_strings or () if s))
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise InvalidArgument("max_new_tokens", f"max_new_tokens must be an integer between 1 and "
                                                    f"{MAX_NEW_TOKENS}, got {self.max_new_tokens!r}")
        if self.seed is not None and not (-MAX_SEED - 1 <= int(self.seed) <= MAX_SEED):
            raise InvalidArgument("seed", f"seed must fit in a signed 64-bit integer, got {self.seed}")
        from hartonomous.sampling import validate_sampler_args     # torch: loaded on first construction

        try:
            validate_sampler_args(self.temperature, self.top_k, self.top_p, self.repetition_penalty)
        except (ValueError, TypeError) as exc:     # the message starts with the argument's name
            message = str(exc)
            name = next((f for f in SAMPLER_FIELDS if message.startswith(f)), "sampler")
            raise InvalidArgument(name, message) from exc
        self._check_adaptive()

    def _check_adaptive(self) -> None:
        """The adaptive sampler's options: probabilities in (0, 1], a usable temperature, a known mode,
        0 <= explore_risk <= cautious_risk <= 1."""
        for name in ("standard_p", "explore_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                raise InvalidArgument(name, f"{name} must be in (0, 1], got {value!r}")
        t = self.explore_temp
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 1e-6 <= t <= 1e6:
            raise InvalidArgument("explore_temp", f"explore_temp must be between 1e-06 and 1e+06, got {t!r}")
        if self.cautious_mode not in CAUTIOUS_MODES:
            raise InvalidArgument("cautious_mode", f"cautious_mode must be one of {', '.join(CAUTIOUS_MODES)}, "
                                                   f"got {self.cautious_mode!r}")
        for name in ("explore_risk", "cautious_risk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise InvalidArgument(name, f"{name} must be between 0 and 1, got {value!r}")
        if self.explore_risk > self.cautious_risk:
            raise InvalidArgument("explore_risk", f"explore_risk must be <= cautious_risk, got {self.explore_risk} "
                                                  f"> {self.cautious_risk}")

    @property
    def sampler(self) -> SamplerArgs:
        return SamplerArgs(self.temperature, self.top_k, self.top_p, self.repetition_penalty)

    def with_options(self, **options: Any) -> "GenerationConfig":
        return replace(self, **options)
