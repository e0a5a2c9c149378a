"""The hybrid path: each step from the spatial path unless the set's predicted risk is high."""

from __future__ import annotations

from hartonomous.paths.declaration import ATOM_SET, EXACT_MODEL, RISK_PREDICTOR, PathContext, PathDeclaration


def build(ctx: PathContext, in_database: bool = False):
    """Spatial steps while the predicted risk is below `risk_threshold`, exact steps otherwise."""
    from hartonomous.backends.hybrid import HybridBackend

    exact = ctx.exact_backend()
    return HybridBackend(ctx.spatial_beside(exact), exact, ctx.options.risk_threshold)


PATH = PathDeclaration(
    name="hybrid", description="each step spatial when the predicted risk is below the threshold, else exact",
    label="spatial unless risky, else exact", build=build, needs=frozenset({EXACT_MODEL, ATOM_SET, RISK_PREDICTOR}),
    next_token_instead="each step comes from one of the two paths; use path='spatial' or path='exact'",
    options=("search_radius", "max_neighbors", "history_weight", "history_window", "risk_threshold"),
    token_fields=("route",))
