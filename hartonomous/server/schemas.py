"""Request and response bodies of the HTTP API, with the input limits.

Defaults come from hartonomous.generation_config.GenerationConfig. The ranges here are what a server
accepts (pydantic constraints, published in the OpenAPI schema; a request outside them gets a
422 whose `loc` names the field). The rules themselves (a non-blank prompt, the sampler's
bounds, max_new_tokens <= MAX_NEW_TOKENS) live in GenerationConfig and the engine, and run
behind these: their InvalidArgument is answered with the same 422 naming the field
(hartonomous.server.errors).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from hartonomous.centroid import HISTORY_WINDOW_MAX
from hartonomous.generation_config import MAX_NEW_TOKENS, GenerationConfig
from hartonomous.paths import (DEFAULT_PATH, PATHS, describe, next_token_paths, option_home, reads_option,
                               speculative_targets)
from hartonomous.paths.options import MAX_DRAFT_TOKENS, PathOptions, draft_ceiling


MAX_PROMPT_CHARS = 8000        # characters of one prompt
MAX_NEW_TOKENS_PER_REQUEST = 512   # the server's cap on max_new_tokens; within the engine's MAX_NEW_TOKENS
MAX_BATCH = 16                 # prompts in one batch request
MAX_STOP_STRINGS = 8
MAX_DISTRIBUTION_ROWS = 1000   # rows next_token returns at most (`limit`)
INT64 = 2**63

# The paths' names and help come from their declarations (hartonomous/paths/).
PathName = Literal[next_token_paths()]          # the paths with a next-token distribution of their own
GenerationPath = Literal[PATHS]                 # every path generates
CautiousMode = Literal["flatten", "signal", "abstain"]
SpeculativeTarget = Literal[speculative_targets()]
StopString = Annotated[str, Field(min_length=1, max_length=200)]
Prompt = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS,
                              description=f"Text to continue (at most {MAX_PROMPT_CHARS} characters, "
                                          "not only whitespace).")]


class Strict(BaseModel):
    """Unknown fields are an error (a typo names itself in the 422)."""

    model_config = ConfigDict(extra="forbid")


class SamplerParams(Strict):
    """The shared sampler (docs/design.md: repetition penalty -> temperature -> top-k -> top-p)."""

    path: PathName = Field(DEFAULT_PATH, description=f"{describe(next_token_paths())}.")
    temperature: float = Field(GenerationConfig.temperature, ge=0, le=100, allow_inf_nan=False,
                               description="0 = greedy, else at least 1e-06.")
    top_k: int | None = Field(GenerationConfig.top_k, ge=0, le=1_000_000,
                              description="Keep the k most likely tokens; 0 or null = off.")
    top_p: float = Field(GenerationConfig.top_p, gt=0, le=1, allow_inf_nan=False, description="Nucleus mass; 1 = off.")
    repetition_penalty: float = Field(GenerationConfig.repetition_penalty, ge=1e-6, le=100, allow_inf_nan=False,
                                      description="1 = off.")
    atom_set: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[^\x00]*$",
                                 description="Spatial: atom set name (the server's default if omitted).")
    search_radius: float | None = Field(None, gt=0, allow_inf_nan=False, description="Spatial: KNN radius.")
    max_neighbors: int = Field(PathOptions.max_neighbors, ge=1, le=100_000, description="Spatial: KNN size.")
    history_weight: float | None = Field(None, ge=0, allow_inf_nan=False,
                                         description="Spatial: weight of the context's own history atoms; 0 = off, "
                                                     "null = the atom set's calibrated weight.")
    history_window: int | None = Field(None, ge=0, le=HISTORY_WINDOW_MAX,
                                       description="Spatial: earlier positions that become history atoms; null = "
                                                   "the atom set's.")
    augment_weight: float | None = Field(None, ge=0, le=1, allow_inf_nan=False,
                                         description="Augmented, for experiments only: fix λ, the store's weight in "
                                                     "the mixture (0 = the exact path, 1 = the store alone); null = "
                                                     "the atom set's gate decides at every step.")

    @model_validator(mode="after")
    def _options_of_the_path(self) -> "SamplerParams":
        """Options that belong to another path are a 422 naming them, never silently ignored (the one
        place for this rule; the CLI refuses the same combinations in hartonomous/cli_generate.py)."""
        errors = [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=(name,),
                                   input=getattr(self, name)) for name, message in self._misplaced_options()]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    def _misplaced_options(self) -> list[tuple[str, str]]:
        """(field, why) for each option given with a path that does not read it."""
        misplaced = []
        target = getattr(self, "speculative_target", None)
        if target is not None and self.path != "speculative":
            misplaced.append(("speculative_target", f"speculative_target is for path 'speculative', not '{self.path}'"))
        if self.augment_weight is not None and not reads_option("augment_weight", self.path, target):
            misplaced.append(("augment_weight", f"augment_weight is for {option_home('augment_weight')}, "
                                                f"not '{self.path}'"))
        return misplaced

    def sampler_options(self) -> dict:
        """The sampler's keyword options (hartonomous.client.Client.next_token, GenerationConfig)."""
        return dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                    repetition_penalty=self.repetition_penalty)

    def config_options(self) -> dict:
        """Keyword options for hartonomous.client.make_config."""
        return self.sampler_options()

    def path_options(self) -> PathOptions:
        """The paths' options (hartonomous.paths.options.PathOptions); the rest keep their defaults."""
        return PathOptions(search_radius=self.search_radius, max_neighbors=self.max_neighbors,
                           history_weight=self.history_weight, history_window=self.history_window,
                           augment_weight=self.augment_weight)


class NextTokenRequest(SamplerParams):
    prompt: Prompt
    limit: int = Field(50, ge=1, le=MAX_DISTRIBUTION_ROWS, description="Rows to return (most likely first).")


class GenerationOptions(SamplerParams):
    path: GenerationPath = Field(DEFAULT_PATH, description=f"{describe()}. `stats`: speculative's rounds, hybrid's "
                                                        "steps sent to the exact model, augmented's mean λ.")
    draft_tokens: int = Field(PathOptions.draft_tokens, ge=1, le=MAX_DRAFT_TOKENS,
                              description="Speculative: tokens drafted in the first round (then adaptive).")
    speculative_target: SpeculativeTarget | None = Field(
        None, description="Speculative only: what the drafts are verified against, exact (the exact model; "
                          "null means this) or augmented (the augmented path's distribution: its output, chains "
                          "only, never remembered); `stats.target` says which ran.")
    max_new_tokens: int = Field(GenerationConfig.max_new_tokens, ge=1, le=MAX_NEW_TOKENS_PER_REQUEST,
                                description=f"At most {MAX_NEW_TOKENS_PER_REQUEST} per request.")
    seed: int | None = Field(None, ge=-INT64, le=INT64 - 1, description="Reproducible sampling; random if null.")
    stop: list[StopString] = Field(default_factory=list, max_length=MAX_STOP_STRINGS,
                                   description="Stop strings; the text is cut before the first one.")
    stop_token_ids: list[Annotated[int, Field(ge=0, lt=2**31)]] = Field(default_factory=list, max_length=32)
    ignore_eos: bool = Field(False, description="Keep going after the end-of-sequence token.")
    in_database: bool = Field(False, description="Spatial: run the whole loop in SQL generate_tokens.")
    risk_threshold: float = Field(PathOptions.risk_threshold, ge=0, allow_inf_nan=False,
                                  description="Hybrid: a step goes to the spatial path when the atom set's predicted "
                                              "risk is below this, else to the exact model (0: always exact; "
                                              "above 1: always spatial).")
    signals: bool = Field(GenerationConfig.signals, description="With details: each event carries the step's "
                                                                "signals (H, H2, varentropy, R, geometry, risk).")
    sources: bool = Field(GenerationConfig.sources, description="Speculative, with details: each kept drafted "
                          "token's event carries `source`, where it came from: the source of the atom that voted "
                          "for it most (corpus, self-distilled, memory or context); one more database call a round.")
    cite: bool = Field(GenerationConfig.cite, description="With details: each token the store picked carries "
                       "`citations`, the files and lines (with license) it came from, or the remembered generation "
                       "(a path that reads an atom set; one database call per cited token).")
    adaptive: bool = Field(GenerationConfig.adaptive, description="Risk-scored adaptive sampling (spatial, exact "
                                                                  "and hybrid paths).")
    standard_p: float = Field(GenerationConfig.standard_p, gt=0, le=1, allow_inf_nan=False,
                              description="Adaptive: top-p of low-risk steps.")
    explore_p: float = Field(GenerationConfig.explore_p, gt=0, le=1, allow_inf_nan=False,
                             description="Adaptive: top-p of medium-risk steps.")
    explore_temp: float = Field(GenerationConfig.explore_temp, ge=1e-6, le=1e6, allow_inf_nan=False,
                                description="Adaptive: temperature of medium-risk steps.")
    cautious_mode: CautiousMode = Field(GenerationConfig.cautious_mode,
                                        description="Adaptive, high-risk steps: flatten (T 2, top-p 0.99), signal "
                                                    "(mark the event) or abstain (stop).")
    explore_risk: float = Field(GenerationConfig.explore_risk, ge=0, le=1, description="Adaptive: risk from which "
                                                                                       "a step explores.")
    cautious_risk: float = Field(GenerationConfig.cautious_risk, ge=0, le=1, description="Adaptive: risk from "
                                                                                         "which a step is cautious.")

    def path_options(self) -> PathOptions:
        """The paths' options, with the speculative and hybrid ones (the draft length's ceiling as the CLI's)."""
        return replace(super().path_options(), draft_tokens=self.draft_tokens,
                       max_draft_tokens=draft_ceiling(self.draft_tokens), risk_threshold=self.risk_threshold,
                       speculative_target=self.speculative_target or PathOptions.speculative_target)

    def config_options(self) -> dict:
        """Keyword options for hartonomous.client.make_config."""
        return dict(self.sampler_options(), max_new_tokens=self.max_new_tokens, seed=self.seed,
                    stop_strings=tuple(self.stop), stop_token_ids=tuple(self.stop_token_ids),
                    stop_at_eos=not self.ignore_eos, signals=self.signals, sources=self.sources,
                    cite=self.cite, adaptive=self.adaptive,
                    standard_p=self.standard_p, explore_p=self.explore_p, explore_temp=self.explore_temp,
                    cautious_mode=self.cautious_mode, explore_risk=self.explore_risk,
                    cautious_risk=self.cautious_risk)


class GenerateRequest(GenerationOptions):
    prompt: Prompt


class StreamRequest(GenerateRequest):
    details: bool = Field(False, description="Add token ids, probabilities, step times and the distribution "
                                             "to each event, and a final `event: result`.")
    top_n: int = Field(10, ge=0, le=100, description="With details: distribution rows per event.")


class BatchRequest(GenerationOptions):
    prompts: list[Prompt] = Field(min_length=1, max_length=MAX_BATCH)


# -- responses -----------------------------------------------------------------------------


class TokenRow(BaseModel):
    token_id: int
    text: str
    probability: float
    cumulative_probability: float | None = None


class NextTokenResponse(BaseModel):
    path: PathName
    atom_set: str | None = None
    rows: list[TokenRow]
    total_rows: int = Field(description="Rows in the whole distribution (before `limit`).")


class TimingsOut(BaseModel):
    prefill_s: float
    total_s: float
    tokens_per_second: float
    time_to_first_token_s: float | None = None


class SpeculativeStatsOut(BaseModel):
    rounds: int
    drafted: int
    accepted: int
    tokens: int
    forwards: int
    draft_s: float
    verify_s: float
    decide_s: float
    sources_s: float = 0.0                # draft_sources calls (with `sources`)
    draft_lengths: list[int]
    draft_widths: list[int] = []          # branches per round: 1 = a chain, > 1 = a tree
    acceptance_rate: float | None = None
    tokens_per_forward: float | None = None
    target: SpeculativeTarget = PathOptions.speculative_target   # what the drafts were verified against


class HybridStatsOut(BaseModel):
    threshold: float
    steps: int
    exact_steps: int
    exact_fraction: float


class AugmentedStatsOut(BaseModel):
    steps: int
    mean_weight: float | None = Field(None, description="The mean λ, the store's weight in the mixture.")
    store_top_picked: int = Field(description="Steps whose picked token was the store's most probable one.")


class MemoryOut(BaseModel):
    remembered: bool = Field(description="Whether the atom set's memory kept this generation.")
    reason: str | None = Field(None, description="Why not: its path (only the exact model's words are kept), "
                                                 "its end, or the set's sampler policy (the settings it refused).")
    generation: int | None = Field(None, description="The remembered generation's number.")
    atoms: int = Field(0, description="Atoms written (one per generated token).")


class GenerateResponse(BaseModel):
    path: GenerationPath
    atom_set: str | None = None
    text: str
    token_ids: list[int]
    prompt_tokens: int
    state: str
    finish_reason: str
    seed: int
    timings: TimingsOut
    stats: SpeculativeStatsOut | HybridStatsOut | AugmentedStatsOut | None = Field(
        None, description="Speculative: rounds, acceptance, draft vs verify time; hybrid: steps sent to the exact "
                          "model; augmented: the mean λ and how often the store's top token was picked.")
    memory: MemoryOut | None = Field(
        None, description="On a server that remembers generations (`serve --remember`): whether this one was "
                          "remembered, and if not why; null elsewhere.")


class BatchResponse(BaseModel):
    results: list[GenerateResponse]


class AtomSetOut(BaseModel):
    name: str
    model: str
    kind: str
    vocab_size: int
    embedding_dim: int
    projection: str
    kernel: str
    bandwidth: float
    centroid_window: int | None = None
    centroid_decay: float
    history_weight: float = 0.0
    history_window: int = 0
    is_default: bool
    stats: dict
    created_at: str | None = None
    paths: list[str] = Field(default_factory=list, description="The paths whose needs this set meets (corpus "
                                                              "labels, a gate, a risk predictor): the playground "
                                                              "ticks its panes by them.")


class AtomSetsResponse(BaseModel):
    atom_sets: list[AtomSetOut]
    default: str | None = None


class ErrorResponse(BaseModel):
    error: str
