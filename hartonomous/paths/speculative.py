"""The speculative path: spatial drafts, verified by the exact model (or the augmented path)."""

from __future__ import annotations

from hartonomous.paths.declaration import ATOM_SET, EXACT_MODEL, PathContext, PathDeclaration


def build(ctx: PathContext, in_database: bool = False):
    """The target (the exact model, or the augmented path with speculative_target="augmented")
    verifying drafts of a spatial backend of its own (same atom set options), draft lengths shaped
    by the exact model's forward costs measured here (hartonomous/speculative/draft_cost.py), each run
    starting from what the caller's last run of its kind learned (hartonomous/speculative/learned.py)."""
    from hartonomous.config import get_settings
    from hartonomous.speculative.decoding import SpeculativeBackend
    from hartonomous.speculative.draft_cost import costs_cache_dir, forward_costs

    options = ctx.options
    target = ctx.backend(options.speculative_target)
    exact = getattr(target, "exact", target)     # the augmented target verifies with its exact model
    # Measured once per runtime and CPU (~6 s for SmolLM2 on 2 cores), then read from the home's cache.
    costs = forward_costs(exact.model, costs_cache_dir(get_settings().home)) if exact.model.use_cache else None
    return SpeculativeBackend(target, ctx.spatial_beside(exact), draft_tokens=options.draft_tokens,
                              max_draft_tokens=options.max_draft_tokens, costs=costs, memory=ctx.memory,
                              max_tree_width=options.max_tree_width, learned=ctx.draft_learning)


PATH = PathDeclaration(
    name="speculative", description="spatial drafts, the exact model verifies: the exact path's output, "
                                    "faster when drafts are kept",
    label="spatial drafts, exact verifies", shown=True, build=build, needs=frozenset({EXACT_MODEL, ATOM_SET}), remembered=True,
    next_token_instead="its distribution is the exact path's; use path='exact'",
    options=("search_radius", "max_neighbors", "history_weight", "history_window", "draft_tokens",
             "max_draft_tokens", "max_tree_width", "speculative_target"),
    token_fields=("origin", "source", "live"))
