"""The atom set as a typed record: every `atom_sets` column, and the build statistics as a type.

`stats` is stored as JSON in `atom_sets.stats`; it is read and written only through
`BuildStats`, whose sections are typed models. Unknown keys are kept (`extra="allow"`), so a set
written by a newer build still loads, and nothing is lost when it is written back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

from hartonomous.risk import RiskModel


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow")


def _section(name: str, doc: str, /, **fields: Any) -> type[_Section]:
    """A stats section: every field optional (None when the build did not record it), unknown keys kept.

    A field is given by its type T (it becomes `T | None = None`) or as a (type, default) pair.
    """
    spec = {key: value if isinstance(value, tuple) else (value | None, None) for key, value in fields.items()}
    return create_model(name, __base__=_Section, __doc__=doc, __module__=__name__, **spec)


ProjectionStats = _section(
    "ProjectionStats", "How well the 3D positions keep the embeddings' neighbourhoods (projection/quality.py).",
    trustworthiness=float, recall_at_10=float, seconds=float)
CalibrationStats = _section(
    "CalibrationStats", "The bandwidth calibration on the holdout (projection/calibrate.py).",
    h=float, top1=float, log_likelihood=float, coverage=float)
CorpusStats = _section(
    "CorpusStats", "What the atoms were distilled from and how to read it again (hartonomous.corpus.origin."
    "recorded_training_text): the built-in corpus's `name` and `version`, or the `files` (absolute paths) with their "
    "`sha256`; the sha256 of the training text (`train_sha256`) and the settings that cut it. `text` is the copy of "
    "the training text that builds before 2026-11-25 stored instead. `split` is how the holdout was cut: "
    "'segments' (absent in older sets) or 'documents' (streamed corpora: python-source, --corpus directories), "
    "which also record the --include globs (`include`), the --exclude globs (`exclude`) and how many files they left "
    "out (`excluded`), python-source's installed `distributions` (name==version), the files listed (after "
    "--exclude), the documents read (`documents`, `holdout_documents`, `train_documents`) with one sha256 over "
    "their sorted (key, file sha256) list (`documents_sha256`), and the files `skipped` by reason.",
    source=str, text=str, name=str, version=str, files=(list[str], Field(default_factory=list)),
    sha256=(list[str], Field(default_factory=list)), train_sha256=str, train_tokens=int, train_segments=int,
    max_tokens=int, holdout_chars=int, context_length=int, seed=int, python=str, split=str, include=list[str],
    exclude=list[str], excluded=int,
    distributions=list[str], listed_files=int, documents=int, documents_sha256=str, holdout_documents=int,
    train_documents=int, skipped=dict[str, int])
HoldoutStats = _section(
    "HoldoutStats", "The held-out slice of the corpus, never used for atoms.",
    source=str, text=str, chars=int, tokens=int, context_length=int)
DistillStats = _section(
    "DistillStats", "The exact model's teacher-forcing pass of the build; `target` (soft | argmax | corpus | mixed, "
    "context sets), `soft_k` and (mixed) `teacher_tokens` say what the atoms store.",
    target=str, soft_k=int, teacher_tokens=int, tokens=int, cached_tokens=int, seconds=float, tokens_per_second=float, device=str,
    batch_tokens=int)
AtomStats = _section(
    "AtomStats", "The atoms written: how many, how many before merging (merge_radius), full-dimensional keys or not.",
    count=int, before_merge=int, merge_radius=float, full_keys=bool)
IngestStats = _section(
    "IngestStats", "Timings of the write (hartonomous/atomset/write.py); `layout` names the index layout.",
    atoms=int, copy_seconds=float, index_seconds=float, cluster_seconds=float, total_seconds=float,
    atoms_per_second=float, layout=str, disk_bytes=int, bytes_per_million_atoms=float)
SyntheticStats = _section(
    "SyntheticStats", "Benchmark sets of uniform random atoms (benchmarks/synthetic.py).",
    distribution=str, seed=int, layout=str)
SplitStats = _section(
    "SplitStats", "One half of the holdout (hartonomous/splits.py): what it is and what the build measured on it.",
    chars=int, tokens=int, positions=int)
ControlStats = _section(
    "ControlStats", "Control atom sets built beside this one, named by what they control for.",
    random_positions=str)   # same atoms, keys from random token positions
LearnedPositionsStats = _section(
    "LearnedPositionsStats", "`build --positions learned` (projection/learned.py): the settings, the training curve "
    "(one row per epoch, epoch 0 = the projection), the epoch kept, the time, the positions' statistics.",
    epochs=int, learning_rate=float, best_epoch=int, stopped_early=bool, seconds=float, split=str, contexts=int,
    curve=(list[dict[str, Any]], Field(default_factory=list)),
    displacement=(dict[str, Any], Field(default_factory=dict)))
ReproducibilityStats = _section(
    "ReproducibilityStats", "What a build's bits depend on besides its command (projection/reproducibility.py): "
    "threads, machine, versions, and sha256 digests of the teacher labels and of the atoms written.",
    threads=int, machine=str, python=str, versions=dict[str, Any], labels_sha256=str,
    atoms_sha256=str)


class BuildStats(_section(
        "BuildStatsSections", "The sections of BuildStats.",
        projection=ProjectionStats, bandwidth=CalibrationStats, centroid_sweep=list[dict[str, Any]],
        corpus=CorpusStats, holdout=HoldoutStats, distill=DistillStats, atoms=AtomStats, key_bandwidth=float,
        key_calibration=dict[str, Any], ingest=IngestStats, synthetic=SyntheticStats,
        calibration_split=SplitStats,      # what the build tuned on (bandwidth, history weight, ...)
        test_split=SplitStats,             # what `compare` scores by default; never tuned on
        history=dict[str, Any],            # the history-weight calibration (grid and choice)
        controls=ControlStats, learned_positions=LearnedPositionsStats,
        reproducibility=ReproducibilityStats,
        self_distill=dict[str, Any])):     # hartonomous/corpus/self_distill.py: what the model wrote for the set
    """Everything a build records about itself; each section is None when the build had no such step."""

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
    layout: str = "rows"            # next_token's KNN storage: 'rows' | 'tiles' (sql/015_knn.sql)
    risk_model: RiskModel | None = None   # the build's risk predictor (hartonomous/risk.py); None: none
    is_default: bool
    created_at: datetime | None
    stats: BuildStats
    atoms: int                      # stats.ingest.atoms when recorded, else counted

    def summary(self) -> dict[str, Any]:
        """The record without stats (what reports and the API show about a set)."""
        return self.model_dump(mode="json", exclude={"stats", "projection_params"})
