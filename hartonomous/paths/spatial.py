"""The spatial path: PostGIS next_token over the atom set (or the whole loop in SQL generate_tokens)."""

from __future__ import annotations

from hartonomous.paths.declaration import ATOM_SET, PathContext, PathDeclaration


def build(ctx: PathContext, in_database: bool = False):
    """The spatial backend; its next_token reads the set's memory too with `spatial_memory`."""
    return ctx.spatial_backend(in_database, memory=ctx.spatial_memory)


PATH = PathDeclaration(
    name="spatial", description="PostGIS next_token: each step a kernel-weighted vote of the nearest atoms",
    label="PostGIS next_token", build=build, needs=frozenset({ATOM_SET}), next_token=True,
    options=("search_radius", "max_neighbors", "history_weight", "history_window"))
