"""The atom set as a typed record: every `atom_sets` column, and the build statistics as a type.

`stats` is stored as JSON in `atom_sets.stats`; it is read and written only through
`BuildStats`, whose sections are typed models. Unknown keys are kept (`extra="allow"`), so a set
written by a newer build still loads, and nothing is lost when it is written back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hartonomous.risk import RiskModel


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


class ProjectionStats(_Section):
    """How well the 3D positions keep the embeddings' neighbourhoods (projection/quality.py)."""

    trustworthiness: float | None = None
    recall_at_10: float | None = None
    seconds: float | None = None


class CalibrationStats(_Section):
    """The bandwidth calibration on the holdout (projection/calibrate.py)."""

    h: float | None = None
    top1: float | None = None
    log_likelihood: float | None = None
    coverage: float | None = None


class CorpusStats(_Section):
    """What the atoms were distilled from; `text` is recorded so baselines can be rebuilt."""

    source: str | None = None
    text: str | None = None
    files: list[str] = Field(default_factory=list)
    train_tokens: int | None = None
    train_segments: int | None = None
    max_tokens: int | None = None
    context_length: int | None = None
    seed: int | None = None
    python: str | None = None


class HoldoutStats(_Section):
    """The held-out slice of the corpus, never used for atoms."""

    source: str | None = None
    text: str | None = None
    chars: int | None = None
    tokens: int | None = None
    context_length: int | None = None


class DistillStats(_Section):
    """The exact model's teacher-forcing pass of the build."""

    target: str | None = None
    tokens: int | None = None
    seconds: float | None = None
    tokens_per_second: float | None = None
    device: str | None = None
    batch_tokens: int | None = None


class AtomStats(_Section):
    count: int | None = None
    before_merge: int | None = None
    merge_radius: float | None = None
    full_keys: bool | None = None


class IngestStats(_Section):
    """Timings of the write (hartonomous/atomset/write.py); `layout` names the index layout."""

    atoms: int | None = None
    copy_seconds: float | None = None
    index_seconds: float | None = None
    cluster_seconds: float | None = None
    total_seconds: float | None = None
    atoms_per_second: float | None = None
    layout: str | None = None


class SyntheticStats(_Section):
    """Benchmark sets of uniform random atoms (hartonomous/benchmark/synthetic.py)."""

    distribution: str | None = None
    seed: int | None = None
    layout: str | None = None


class SplitStats(_Section):
    """One half of the holdout (hartonomous/splits.py): what it is and what the build measured on it."""

    chars: int | None = None
    tokens: int | None = None
    positions: int | None = None


class ControlStats(_Section):
    """Control atom sets built beside this one, named by what they control for."""

    random_positions: str | None = None   # same atoms, keys from random token positions


class BuildStats(_Section):
    """Everything a build records about itself; each section is None when the build had no such step."""

    projection: ProjectionStats | None = None
    bandwidth: CalibrationStats | None = None
    centroid_sweep: list[dict[str, Any]] | None = None
    corpus: CorpusStats | None = None
    holdout: HoldoutStats | None = None
    distill: DistillStats | None = None
    atoms: AtomStats | None = None
    key_bandwidth: float | None = None
    key_calibration: dict[str, Any] | None = None
    ingest: IngestStats | None = None
    synthetic: SyntheticStats | None = None
    calibration_split: SplitStats | None = None    # what the build tuned on (bandwidth, history weight, ...)
    test_split: SplitStats | None = None           # what `compare` scores by default; never tuned on
    history: dict[str, Any] | None = None          # the history-weight calibration (grid and choice)
    controls: ControlStats | None = None

    @model_validator(mode="before")
    @classmethod
    def _legacy_synthetic(cls, data: Any) -> Any:
        """Sets from before this type recorded `"synthetic": true` with its fields at the top level."""
        if isinstance(data, dict) and data.get("synthetic") is True:
            data = {**data, "synthetic": {k: data[k] for k in ("distribution", "seed", "layout") if k in data}}
        return data

    @classmethod
    def from_json(cls, value: dict | None) -> "BuildStats":
        return cls.model_validate(value or {})

    def to_json(self) -> dict[str, Any]:
        """The JSON stored in atom_sets.stats (sections that are None are left out)."""
        return self.model_dump(mode="json", exclude_none=True)


class AtomSet(BaseModel):
    """One row of `atom_sets`, plus its atom count; immutable once built."""

    model_config = ConfigDict(frozen=True)

    id: int
    name: str
    model: str                      # the model's own name (config.name_or_path) at build time
    model_key: str | None           # what `build --model` was given: 'smollm2' or a local model folder
    kind: str                       # 'token' | 'context'
    vocab_size: int
    embedding_dim: int
    projection: str
    projection_params: dict[str, Any]
    centroid_window: int | None
    centroid_decay: float
    kernel: str                     # 'gaussian' | 'exponential'
    bandwidth: float
    history_weight: float           # weight of the context's own history atoms (0 = off)
    history_window: int             # how many earlier context positions become history atoms
    risk_model: RiskModel | None = None   # the build's risk predictor (hartonomous/risk.py); None: none
    is_default: bool
    created_at: datetime | None
    stats: BuildStats
    atoms: int                      # stats.ingest.atoms when recorded, else counted

    def summary(self) -> dict[str, Any]:
        """The record without stats (what reports and the API show about a set)."""
        return self.model_dump(mode="json", exclude={"stats", "projection_params"})
