"""The atom set's risk predictor: P(spatial top-1 differs from the exact model's) from step signals.

A logistic regression stored as data in `atom_sets.risk_model` (fitted offline by the build on
the calibration half: projection/risk.py), evaluated here and in SQL (`ht_risk` in
sql/050_signals.sql) with the same formula:

    z = intercept + sum_i coef_i * (x_i - mean_i) / scale_i,    risk = 1 / (1 + exp(-z))

over the named features (hartonomous.signals.FEATURES). Data, not a pickle: any reader can
evaluate it, and the SQL function does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, model_validator

TARGET = "spatial_top1_differs"


class RiskModel(BaseModel):
    """Coefficients, feature names and scaling of a logistic regression, plus how it was fitted."""

    model_config = ConfigDict(frozen=True, extra="allow")

    target: str = TARGET
    features: list[str]
    mean: list[float]
    scale: list[float]
    coef: list[float]
    intercept: float
    positions: int | None = None               # calibration positions it was fitted on
    base_rate: float | None = None             # share of those where spatial top-1 was wrong
    calibration_auc: float | None = None       # ROC AUC on the same positions (in-sample)

    @model_validator(mode="after")
    def _same_lengths(self) -> "RiskModel":
        n = len(self.features)
        if not (len(self.mean) == len(self.scale) == len(self.coef) == n) or n == 0:
            raise ValueError("risk model: features, mean, scale and coef need the same non-zero length")
        if any(not s > 0 for s in self.scale):
            raise ValueError("risk model: every scale must be > 0")
        return self

    def predict(self, signals: Mapping[str, float | None]) -> float | None:
        """The predicted risk for one step's signals (None when a feature is missing, as in SQL)."""
        z = self.intercept
        for name, mean, scale, coef in zip(self.features, self.mean, self.scale, self.coef):
            x = signals.get(name)
            if x is None:
                return None
            z += coef * (float(x) - mean) / scale
        return 0.0 if z < -700 else 1.0 / (1.0 + math.exp(-z))
