"""The atom set's predictors from step signals: the risk and the calibration gap (issue 16).

Both are linear models stored as data in `atom_sets.risk_model` (fitted offline by the build on
the calibration half: projection/risk.py) and evaluated here and in SQL (`ht_linear` and
`ht_risk` in sql/050_signals.sql) with the same formulas over the named features
(hartonomous.signals.FEATURES):

    z = intercept + sum_i coef_i * (x_i - mean_i) / scale_i

- the risk, P(spatial top-1 differs from the exact model's argmax), is the logistic
  1 / (1 + exp(-z)) of the model's own z;
- the predicted calibration gap (the original design's NLL - H: the spatial distribution's
  negative log-likelihood of the text's actual next token minus its entropy; positive means
  confident but wrong) is z of the nested `gap` model, a linear regression.

Data, not a pickle: any reader can evaluate them, and the SQL functions do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, model_validator

TARGET = "spatial_top1_differs"
GAP_TARGET = "calibration_gap"


class LinearModel(BaseModel):
    """Feature names, their standardisation and the coefficients of z (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="allow")

    features: list[str]
    mean: list[float]
    scale: list[float]
    coef: list[float]
    intercept: float

    @model_validator(mode="after")
    def _same_lengths(self) -> "LinearModel":
        n = len(self.features)
        if not (len(self.mean) == len(self.scale) == len(self.coef) == n) or n == 0:
            raise ValueError(f"{type(self).__name__}: features, mean, scale and coef need the same non-zero length")
        if any(not s > 0 for s in self.scale):
            raise ValueError(f"{type(self).__name__}: every scale must be > 0")
        return self

    def linear(self, signals: Mapping[str, float | None]) -> float | None:
        """z for one step's signals (None when a feature is missing, as in SQL ht_linear)."""
        z = self.intercept
        for name, mean, scale, coef in zip(self.features, self.mean, self.scale, self.coef):
            x = signals.get(name)
            if x is None:
                return None
            z += coef * (float(x) - mean) / scale
        return z


class GapModel(LinearModel):
    """A linear regression of the calibration gap NLL - H (nats) on the step signals.

    NLL is -ln p(y) of the text's next token y under the spatial kernel distribution, capped at
    `nll_cap` = ln(vocabulary size) (the NLL of a uniform guess) because the spatial
    distribution gives every token outside its candidates probability 0."""

    target: str = GAP_TARGET
    nll_cap: float
    positions: int | None = None               # calibration positions it was fitted on
    mean_gap: float | None = None              # their mean gap (what the intercept alone predicts)
    calibration_r2: float | None = None        # R^2 on the same positions (in-sample)

    def predict(self, signals: Mapping[str, float | None]) -> float | None:
        """The predicted gap (nats) for one step's signals."""
        return self.linear(signals)


class RiskModel(LinearModel):
    """A logistic regression of "spatial top-1 is wrong", plus how it was fitted and the gap model."""

    target: str = TARGET
    positions: int | None = None               # calibration positions it was fitted on
    base_rate: float | None = None             # share of those where spatial top-1 was wrong
    calibration_auc: float | None = None       # ROC AUC on the same positions (in-sample)
    gap: GapModel | None = None                # the calibration-gap regression (None: not fitted)

    def predict(self, signals: Mapping[str, float | None]) -> float | None:
        """The predicted risk for one step's signals (None when a feature is missing, as in SQL)."""
        z = self.linear(signals)
        if z is None:
            return None
        return 0.0 if z < -700 else 1.0 if z > 700 else 1.0 / (1.0 + math.exp(-z))

    def predict_gap(self, signals: Mapping[str, float | None]) -> float | None:
        """The predicted calibration gap NLL - H (None without a gap model or with a feature missing)."""
        return None if self.gap is None else self.gap.predict(signals)
