"""What `hartonomous build` takes (BuildOptions), its defaults, and the checks run before any work."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hartonomous.centroid import HISTORY_WINDOW_MAX
from hartonomous.corpus.sources import PYTHON_SOURCE, resolve_source
from hartonomous.centroid import validate as validate_centroid
from hartonomous.atomset.write import DEFAULT_LAYOUT, LAYOUTS
from hartonomous.errors import UserError
from projection.calibrate import OBJECTIVES
from projection.learned import DEFAULT_EPOCHS, DEFAULT_LEARNING_RATE, MAX_WINDOW, check_training
from projection.history import CRITERIA, DEFAULT_CRITERION
from projection.lattice import DEFAULT_LATTICE_WINDOW, lattice_decay, lattice_side

# Chosen by centroid sweeps on SmolLM2 + the default corpus (docs/atoms.md): window 3 / decay
# 0.01 was at the top of held-out top-1 at both 20K and 100K training tokens ((2|4, 0.01) within
# 0.01); uniform or long windows were far worse.
DEFAULT_CONTEXT_WINDOW: int | None = 3
DEFAULT_CONTEXT_DECAY = 0.01
# Token atoms keep the original design's centroid: every context token, uniform weights.
DEFAULT_TOKEN_WINDOW: int | None = None
DEFAULT_TOKEN_DECAY = 1.0
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
TARGETS = ("soft", "argmax", "corpus", "mixed")
DEFAULT_TEACHER_TOKENS = 100_000   # --target mixed: training tokens labelled by the exact model
DEFAULT_SOFT_K = 8
MAX_SOFT_K = 64
POSITIONS = ("projection", "learned", "lattice")
KERNELS = ("gaussian", "exponential", "backoff")
RANDOM_POSITIONS_SUFFIX = ".random-positions"
FULL_KEYS_MAX_TOKENS = 1_000_000   # --full-keys above this is refused: 2.3 KB per atom (576 float4 for SmolLM2)
FULL_KEY_BYTES = 576 * 4
SMOLLM2_VOCAB = 49152  # the default model's vocabulary: the lattice decay checked before the model loads
KEEP = object()


def code_corpus(corpus: list[Path], include: list[str]) -> bool:
    """Whether --corpus names source code only: the built-in python-source, `.py` files, or
    directories read through --include globs that all end in `.py`."""
    if not corpus:
        return False        # the built-in python-docstrings
    globs_of_code = bool(include) and all(glob.endswith(".py") for glob in include)
    return all(str(entry) == PYTHON_SOURCE or (entry.suffix == ".py" and not entry.is_dir())
               or (entry.is_dir() and globs_of_code) for entry in corpus)


@dataclass
class BuildOptions:
    """Everything `hartonomous build` takes; validated by `check`."""

    name: str
    kind: str = "context"
    model: str = "smollm2"
    corpus: list[Path] = field(default_factory=list)  # files, directories, or a built-in name (hartonomous.corpus.sources)
    include: list[str] = field(default_factory=list)  # globs on the names of the files in --corpus directories
    exclude: list[str] = field(default_factory=list)  # globs on their paths relative to the root (and python-source's)
    max_tokens: int = 100_000
    projection: str = "lmds"
    landmarks: int = 512
    landmark_method: str = "kmeans++"
    metric: str = "euclidean"
    window: int | None | object = KEEP  # KEEP = the kind's default; None = every token
    decay: float | None = None  # None = the kind's default
    target: str = "soft"  # soft: the exact top-k as weighted atoms; argmax: one atom; corpus: the text's token
    soft_k: int = DEFAULT_SOFT_K
    teacher_tokens: int = DEFAULT_TEACHER_TOKENS  # --target mixed: the first N training tokens get soft labels
    merge_radius: float = 0.0
    full_keys: bool = False
    kernel: str | None = None  # None = backoff with --positions lattice, else gaussian
    bandwidth: float | None = None  # None = calibrate on the holdout
    bandwidth_objective: str = "log-likelihood"
    max_neighbors: int = 100
    sweep: bool = False
    context_length: int = 512
    batch_tokens: int = 4096
    holdout_chars: int | None = None
    seed: int = 0
    device: str = "cpu"
    replace: bool = False
    make_default: bool = False
    history_weight: float | None = None  # None = calibrate (context sets) / 0 (token sets); 0 = off
    history_window: int = 512
    controls: bool = False  # also build <name>.random-positions
    gate: bool = True  # --target corpus: fit the augmented path's gate on the calibration half after the ingest
    layout: str = DEFAULT_LAYOUT  # next_token's KNN storage: rows | tiles (hartonomous/atomset/write.py)
    positions: str | None = None  # None = lattice for code corpora (code_corpus), else projection; learned: trained
                                  # from the projection (projection/learned.py); lattice: deep keys
    epochs: int = DEFAULT_EPOCHS
    learning_rate: float = DEFAULT_LEARNING_RATE
    learn_decay: bool = False
    keep_epoch: str = "best"  # best (early-stopped on the calibration half) | last (a diagnostic)
    calibrate_by: str = DEFAULT_CRITERION  # how (history weight, h) is chosen: top1 or loglik (projection/history.py)
    teacher_cache: Path | None = None  # the teacher-label cache (hartonomous.corpus.teacher); None = always run the model
    self_distill: int = 0  # tokens the exact model writes as extra training text (hartonomous/corpus/self_distill.py)
    self_distill_only: bool = False  # atoms from the self-distilled text alone (the corpus gives prompts and holdout)
    self_distill_temperature: float = 0.8  # odd batches sampled at this temperature; 0 = every batch greedy

    def __post_init__(self) -> None:
        if self.positions is None:
            self.positions = "lattice" if self._deep_keys_by_default() else "projection"
        if self.kernel is None:
            self.kernel = "backoff" if self.positions == "lattice" else "gaussian"

    def _deep_keys_by_default(self) -> bool:
        """Lattice positions (backoff kernel) are the default for context sets of code, where they
        agree with the exact model more often than the window-3 Gaussian keys (docs/fidelity.md,
        "Default keys per corpus"); prose keeps the Gaussian keys, which tie there on top-1 and
        are ahead on every distribution metric. Options that only make sense for the Gaussian keys
        (--window, --decay, --sweep, --kernel other than backoff) keep the projection."""
        return (self.kind == "context" and code_corpus(self.corpus, self.include) and self.window is KEEP
                and self.decay is None and not self.sweep and self.kernel in (None, "backoff"))

    @property
    def random_positions_name(self) -> str:
        return self.name + RANDOM_POSITIONS_SUFFIX

    def resolved_window(self) -> int | None:
        if self.window is KEEP:
            if self.positions == "lattice":
                return DEFAULT_LATTICE_WINDOW
            return DEFAULT_CONTEXT_WINDOW if self.kind == "context" else DEFAULT_TOKEN_WINDOW
        return self.window  # type: ignore[return-value]

    def resolved_decay(self, vocab_size: int = SMOLLM2_VOCAB) -> float:
        """--decay, or the default: with --positions lattice the lattice's contraction for the
        vocabulary (projection/lattice.py), else the kind's."""
        if self.decay is None:
            if self.positions == "lattice":
                return lattice_decay(lattice_side(vocab_size))
            return DEFAULT_CONTEXT_DECAY if self.kind == "context" else DEFAULT_TOKEN_DECAY
        return self.decay

    def check(self) -> None:
        if not NAME_PATTERN.match(self.name or ""):
            raise UserError(f"--name must be 1-63 letters, digits, '.', '_' or '-' (starting with a letter "
                            f"or digit), got '{self.name}'")
        if self.kind not in ("token", "context"):
            raise UserError(f"--kind must be 'token' or 'context', got '{self.kind}'")
        if self.layout not in LAYOUTS:
            raise UserError(f"--layout must be one of {', '.join(LAYOUTS)}, got '{self.layout}'")
        if self.max_tokens < 2:
            raise UserError(f"--max-tokens must be at least 2, got {self.max_tokens}")
        if self.target not in TARGETS:
            raise UserError(f"--target must be one of {', '.join(TARGETS)}, got '{self.target}'")
        if self.self_distill < 0:
            raise UserError(f"--self-distill must be >= 0 tokens, got {self.self_distill}")
        if self.self_distill and self.kind != "context":
            raise UserError("--self-distill adds context atoms; pass --kind context")
        if not 0 <= self.self_distill_temperature <= 10:
            raise UserError(f"--self-distill-temperature must be between 0 (all greedy) and 10, "
                            f"got {self.self_distill_temperature}")
        if self.self_distill_only and not self.self_distill:
            raise UserError("--self-distill-only keeps the self-distilled atoms alone; pass --self-distill N too")
        if self.teacher_tokens < 0:
            raise UserError(f"--teacher-tokens must be >= 0, got {self.teacher_tokens}")
        if not 1 <= self.soft_k <= MAX_SOFT_K:
            raise UserError(f"--soft-k must be between 1 and {MAX_SOFT_K}, got {self.soft_k}")
        if self.history_weight is not None and not (self.history_weight >= 0 and np.isfinite(self.history_weight)):
            raise UserError(f"--history-weight must be a finite number >= 0, got {self.history_weight}")
        if not 0 <= self.history_window <= HISTORY_WINDOW_MAX:
            raise UserError(f"--history-window must be between 0 and {HISTORY_WINDOW_MAX}, got {self.history_window}")
        if self.controls and self.kind != "context":
            raise UserError("--controls builds a random-positions control of a context set; pass --kind context")
        if self.controls and not NAME_PATTERN.match(self.random_positions_name):
            raise UserError(f"--name is too long for --controls: the control set '{self.random_positions_name}' "
                            "needs a name of at most 63 characters")
        if self.kernel not in KERNELS:
            raise UserError(f"--kernel must be one of {', '.join(KERNELS)}, got '{self.kernel}'")
        if self.kernel == "backoff" and not self.resolved_decay() < 1:
            raise UserError("--kernel backoff needs a --decay below 1 (its radii are the bandwidth times powers "
                            "of the decay)")
        if self.bandwidth is not None and not (self.bandwidth > 0 and np.isfinite(self.bandwidth)):
            raise UserError(f"--bandwidth must be a positive number, got {self.bandwidth}")
        if self.calibrate_by not in CRITERIA:
            raise UserError(f"--calibrate-by must be one of {', '.join(CRITERIA)}, got '{self.calibrate_by}'")
        if self.bandwidth_objective not in OBJECTIVES:
            raise UserError(f"--bandwidth-objective must be one of {', '.join(OBJECTIVES)}, "
                            f"got '{self.bandwidth_objective}'")
        if not 1 <= self.max_neighbors <= 100_000:
            raise UserError(f"--max-neighbors must be between 1 and 100000, got {self.max_neighbors}")
        if self.full_keys and self.max_tokens > FULL_KEYS_MAX_TOKENS:
            raise UserError(f"--full-keys stores a {FULL_KEY_BYTES:,}-byte key per atom: about "
                            f"{self.max_tokens * FULL_KEY_BYTES / 1e9:.0f} GB at --max-tokens {self.max_tokens:,}; "
                            f"it is refused above {FULL_KEYS_MAX_TOKENS:,} training tokens")
        if self.merge_radius < 0 or not np.isfinite(self.merge_radius):
            raise UserError(f"--merge-radius must be >= 0, got {self.merge_radius}")
        if self.batch_tokens < 1:
            raise UserError(f"--batch-tokens must be positive, got {self.batch_tokens}")
        if self.holdout_chars is not None and self.holdout_chars < 1:
            raise UserError(f"--holdout-chars must be positive, got {self.holdout_chars}")
        resolve_source(self.corpus, self.include, self.exclude)   # the paths exist, or name a built-in corpus
        self._check_positions()
        try:
            validate_centroid(self.resolved_window(), self.resolved_decay())
        except ValueError as exc:
            raise UserError(f"--window/--decay: {exc}") from None

    def _check_positions(self) -> None:
        if self.positions not in POSITIONS:
            raise UserError(f"--positions must be one of {', '.join(POSITIONS)}, got '{self.positions}'")
        if self.positions == "lattice":
            if self.kind != "context":
                raise UserError("--positions lattice keys context atoms; pass --kind context")
            if self.sweep:
                raise UserError("--positions lattice has its own window and decay (projection/lattice.py); "
                                "drop --sweep")
            return
        if self.positions != "learned":
            return
        if self.kernel == "backoff":
            raise UserError("--positions learned trains a gaussian or exponential kernel; drop --kernel backoff")
        if self.kind != "context":
            raise UserError("--positions learned trains the positions of a context set; pass --kind context")
        if self.target == "mixed":
            raise UserError("--positions learned trains on one kind of label; pass --target soft, argmax or corpus")
        if self.self_distill:
            raise UserError("--positions learned trains on the corpus's labels only; drop --self-distill")
        window = self.resolved_window()
        if window is None or window > MAX_WINDOW:
            raise UserError(f"--positions learned needs a finite --window of at most {MAX_WINDOW}, got {window}")
        if self.merge_radius != 0:
            raise UserError("--positions learned needs --merge-radius 0 (it trains on exactly merged atoms)")
        check_training(self.epochs, self.learning_rate, self.keep_epoch)
