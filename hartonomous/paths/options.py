"""The paths' options and their defaults, in one object (as GenerationConfig keeps the sampler's).

Each path's declaration names the options it reads (hartonomous/paths/<name>.py); the Client, the
CLI and the HTTP schema take their defaults from this class, and its checks run on construction
(InvalidArgument naming the option); which paths a speculative round may verify against is the
registry's to say (hartonomous.paths.check_speculative_target, run where a path is built). Light:
importing it loads no model code, and it imports nothing of the paths (the backends import it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from hartonomous.errors import InvalidArgument

MAX_DRAFT_TOKENS = 64     # draft_tokens' own bound on n (SQL); hartonomous.speculative.decoding reads it here
MAX_TREE_WIDTH = 16       # draft_tree's own bound on width (SQL); likewise


@dataclass(frozen=True)
class PathOptions:
    """Options of the paths (not of one generation: those are GenerationConfig's)."""

    search_radius: float | None = None    # spatial: KNN radius (None: the set's)
    max_neighbors: int = 100              # spatial: KNN size
    history_weight: float | None = None   # spatial: weight of the context's own atoms (None: the set's)
    history_window: int | None = None     # spatial: earlier positions that become history atoms (None: the set's)
    draft_tokens: int = 4                 # speculative: tokens drafted in a cold first round (then adaptive)
    max_draft_tokens: int = 8             # speculative: the adaptive draft length's ceiling
    max_tree_width: int = 1               # speculative: > 1 drafts trees this wide
    speculative_target: str = "exact"     # speculative: the distribution drafts are verified against
    risk_threshold: float = 0.5           # hybrid: spatial steps below this predicted risk, exact above
    augment_weight: float | None = None   # augmented: a fixed λ for experiments (None: the set's gate)

    def __post_init__(self) -> None:
        object.__setattr__(self, "risk_threshold", check_threshold(self.risk_threshold))
        object.__setattr__(self, "augment_weight", check_augment_weight(self.augment_weight))

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


def draft_ceiling(draft_tokens: int) -> int:
    """The draft length's ceiling for a first draft of `draft_tokens` (the CLI's and the server's rule)."""
    return max(PathOptions.max_draft_tokens, draft_tokens)


def check_threshold(threshold: float) -> float:
    """The hybrid path's routing threshold: a number >= 0 (math.inf: always spatial)."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or math.isnan(threshold) \
            or threshold < 0:
        raise InvalidArgument("risk_threshold", f"risk_threshold must be a number >= 0 (0: always exact, "
                                                f"inf: always spatial), got {threshold!r}")
    return float(threshold)


def check_augment_weight(weight: float | None) -> float | None:
    """λ for the augmented path, fixed for experiments: None (the gate decides) or a number in [0, 1]."""
    if weight is None:
        return None
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
            or not 0.0 <= weight <= 1.0:
        raise InvalidArgument("augment_weight", f"augment_weight (λ) must be a number in [0, 1] or None (the "
                                                f"set's gate decides), got {weight!r}")
    return float(weight)
