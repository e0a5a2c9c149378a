"""Entropy signals of one next-token distribution (natural logs, nats).

    H    = -sum p ln p                      Shannon entropy
    H2   = -ln sum p^2                      Rényi collision entropy (alpha = 2)
    V    = sum p (ln p + H)^2               varentropy: the variance of -ln p under p
    R    = H2 - (H - V / 2)                 what (H, V) do not explain of H2
    gap  = NLL - H,  NLL = -ln p(actual)    calibration gap (> 0: confident and wrong)

Only tokens with p > 0 enter H, H2 and V, so a sparse distribution is measured as the
sampler sees it; the NLL passed in decides how zero-probability targets are handled.
H, H2 and V are hartonomous/entropy.py's (the runtime's signals use the same definitions).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from hartonomous.entropy import renyi2, shannon, varentropy

SIGNALS = ("H", "H2", "V", "R", "calibration_gap")


@dataclass(frozen=True)
class Signals:
    H: float
    H2: float
    V: float
    R: float
    calibration_gap: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def signals(p: np.ndarray, nll: float) -> Signals:
    """All five signals of distribution `p` given the NLL of the actual next token."""
    h, h2, v = shannon(p), renyi2(p), varentropy(p)
    return Signals(H=h, H2=h2, V=v, R=h2 - (h - 0.5 * v), calibration_gap=float(nll) - h)
