"""The exact path: the transformer with a KV cache (torch, int4 or llama runtime)."""

from __future__ import annotations

from hartonomous.paths.declaration import EXACT_MODEL, PathContext, PathDeclaration


def build(ctx: PathContext, in_database: bool = False):
    """The exact model's backend (its per-step risk is the spatial predictor's, read on demand)."""
    return ctx.exact_backend()


PATH = PathDeclaration(
    name="exact", description="the transformer with a KV cache",
    label="transformer, KV cache", shown=True, build=build, needs=frozenset({EXACT_MODEL}), remembered=True,
    next_token=True, speculative_target=True)
