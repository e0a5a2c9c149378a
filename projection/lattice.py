"""Lattice token positions: deep context keys whose distance order is longest-suffix order.

A context key is the centroid c = sum_k d^k p(t_{n-1-k}) / sum_k d^k over the last W tokens
(hartonomous.centroid). With every token on its own cell of an integer lattice of side L (L^3 >= V)
and a contraction d small enough, c is a chaos-game representation of the context. Let
t = sqrt(3) (L - 1) d / (1 - d), the most that all tokens older than one level can move a key, in
units of that level. Two contexts that agree on their last s tokens and differ in the one before
have keys at least d^s (1 - t) apart (before the common normalisation); two that agree on at least
s + 1 tokens are at most d^s t apart. With t < 1/2, i.e.
d / (1 - d) < 1 / (2 sqrt(3) (L - 1)), a longer common suffix always means a strictly nearer key:
a KNN is then a geometric ∞-gram (docs/atoms.md "Deep keys"). The decay chosen here is the
largest power of two that satisfies it (1/128 for L = 37), so the keys' sums are exact in binary
floating point up to the last level that fits in 53 bits.

Which token gets which cell: the tokens, sorted along a 3-D Hilbert curve through their projected
positions, take the lattice's cells in the lattice's own Hilbert order, so tokens near each other in
the projection get neighbouring cells and a backoff that lands on a similar token stays near.

Bits: W levels of a V-token vocabulary need W log2 V bits (125 for W = 8 and V = 49,152); three
doubles hold 159. The GiST index keeps float4 boxes (72 bits), so the index narrows the search to
the first few levels and the exact recheck on the stored doubles orders the rest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hartonomous.atomset.hilbert import hilbert_codes, hilbert_codes_of_cells

DEFAULT_LATTICE_WINDOW = 8


@dataclass(frozen=True)
class Lattice:
    """Every token's lattice cell (centred integer coordinates), the side and the contraction."""

    positions: np.ndarray  # (V, 3) float64: cell - (side - 1) / 2
    side: int
    decay: float

    @property
    def ladder_top(self) -> float:
        """The radius that separates one suffix level from the next (the backoff kernel's h): above
        the widest spread of contexts sharing no token, below the nearest context sharing one
        token scaled up by 1/d; the middle of that gap, for keys normalised by the weights' sum."""
        spread = math.sqrt(3.0) * (self.side - 1)
        t = spread * self.decay / (1.0 - self.decay)
        return 0.5 * ((spread + t) + (1.0 - t) / self.decay) * (1.0 - self.decay)


def lattice_side(vocab_size: int) -> int:
    """The smallest L with L^3 >= vocab_size."""
    side = max(2, round(vocab_size ** (1.0 / 3.0)))
    while side ** 3 < vocab_size:
        side += 1
    return side


def lattice_decay(side: int) -> float:
    """The largest power of two d with d / (1 - d) < 1 / (2 sqrt(3) (side - 1)): strict suffix order."""
    bound = 1.0 / (2.0 * math.sqrt(3.0) * (side - 1))
    exponent = 1
    while (2.0 ** -exponent) / (1.0 - 2.0 ** -exponent) >= bound:
        exponent += 1
    return 2.0 ** -exponent


def lattice_cells(side: int) -> np.ndarray:
    """The lattice's cells (n, 3) in the order of a 3-D Hilbert curve over the enclosing power-of-two cube."""
    axis = np.arange(side, dtype=np.uint64)
    cells = np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), axis=-1).reshape(-1, 3)
    bits = max(1, int(side - 1).bit_length())
    return cells[np.argsort(hilbert_codes_of_cells(cells, bits), kind="stable")]


def lattice_positions(projected: np.ndarray) -> Lattice:
    """One lattice cell per token, assigned along Hilbert curves (see the module docstring)."""
    projected = np.asarray(projected, dtype=np.float64)
    vocab = len(projected)
    side = lattice_side(vocab)
    cells = lattice_cells(side)[:vocab].astype(np.float64) - (side - 1) / 2.0
    ranks = np.argsort(hilbert_codes(projected), kind="stable")
    positions = np.empty((vocab, 3), dtype=np.float64)
    positions[ranks] = cells
    return Lattice(positions, side, lattice_decay(side))
