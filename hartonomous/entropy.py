"""Entropies of one next-token distribution (natural logs, nats), for the runtime and the reports.

    H    = -sum p ln p                      Shannon entropy
    H2   = -ln sum p^2                      Rényi collision entropy (alpha = 2)
    V    = sum p (ln p + H)^2               varentropy: the variance of -ln p under p

Only tokens with p > 0 enter H and V, so a sparse distribution is measured as the sampler sees it.
The per-step signals (hartonomous/signals.py) and the comparison reports
(hartonomous/compare/signals.py) both use these definitions.
"""

from __future__ import annotations

import numpy as np


def shannon(p: np.ndarray) -> float:
    p = np.asarray(p, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def renyi2(p: np.ndarray) -> float:
    p = np.asarray(p, dtype=np.float64)
    return float(-np.log((p * p).sum()))


def varentropy(p: np.ndarray) -> float:
    p = np.asarray(p, dtype=np.float64)
    p = p[p > 0]
    h = -(p * np.log(p)).sum()
    return float((p * (np.log(p) + h) ** 2).sum())
