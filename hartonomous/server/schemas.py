"""Request and response bodies of the HTTP API, with the input limits.

Ranges are pydantic constraints, so a request outside them gets a 422 whose `loc` names the
field. The sampler's own rules (hartonomous.sampling.validate_sampler_args) still run behind
these; the ranges here only keep requests within what a server should accept.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_PROMPT_CHARS = 8000        # characters of one prompt
MAX_NEW_TOKENS = 512           # cap on max_new_tokens per generation
MAX_BATCH = 16                 # prompts in one batch request
MAX_STOP_STRINGS = 8
MAX_DISTRIBUTION_ROWS = 1000   # rows next_token returns at most (`limit`)
INT64 = 2**63

PathName = Literal["spatial", "exact"]
StopString = Annotated[str, Field(min_length=1, max_length=200)]
Prompt = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS,
                              description=f"Text to continue (at most {MAX_PROMPT_CHARS} characters).")]


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("the prompt is empty or only whitespace; pass some text to continue")
    return value


class Strict(BaseModel):
    """Unknown fields are an error (a typo names itself in the 422)."""

    model_config = ConfigDict(extra="forbid")


class SamplerParams(Strict):
    """The shared sampler (docs/design.md: repetition penalty -> temperature -> top-k -> top-p)."""

    path: PathName = Field("spatial", description="spatial (PostGIS next_token) or exact (the transformer).")
    temperature: float = Field(1.0, ge=0, le=100, allow_inf_nan=False, description="0 = greedy.")
    top_k: int | None = Field(40, ge=0, le=1_000_000, description="Keep the k most likely tokens; 0 or null = off.")
    top_p: float = Field(0.9, gt=0, le=1, allow_inf_nan=False, description="Nucleus mass; 1 = off.")
    repetition_penalty: float = Field(1.0, ge=1e-6, le=100, allow_inf_nan=False, description="1 = off.")
    atom_set: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[^\x00]*$",
                                 description="Spatial: atom set name (the server's default if omitted).")
    search_radius: float | None = Field(None, gt=0, allow_inf_nan=False, description="Spatial: KNN radius.")
    max_neighbors: int = Field(100, ge=1, le=100_000, description="Spatial: KNN size.")

    @field_validator("temperature")
    @classmethod
    def _temperature_not_tiny(cls, value: float) -> float:
        if 0 < value < 1e-6:        # logits / T would overflow; the sampler rejects it too
            raise ValueError("temperature must be 0 (greedy) or at least 1e-06")
        return value


class NextTokenRequest(SamplerParams):
    prompt: Prompt
    limit: int = Field(50, ge=1, le=MAX_DISTRIBUTION_ROWS, description="Rows to return (most likely first).")

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, prompt: str) -> str:
        return _not_blank(prompt)


class GenerationOptions(SamplerParams):
    max_new_tokens: int = Field(64, ge=1, le=MAX_NEW_TOKENS, description=f"At most {MAX_NEW_TOKENS}.")
    seed: int | None = Field(None, ge=-INT64, le=INT64 - 1, description="Reproducible sampling; random if null.")
    stop: list[StopString] = Field(default_factory=list, max_length=MAX_STOP_STRINGS,
                                   description="Stop strings; the text is cut before the first one.")
    stop_token_ids: list[Annotated[int, Field(ge=0, lt=2**31)]] = Field(default_factory=list, max_length=32)
    ignore_eos: bool = Field(False, description="Keep going after the end-of-sequence token.")
    in_database: bool = Field(False, description="Spatial: run the whole loop in SQL generate_tokens.")

    def config_options(self) -> dict:
        """Keyword options for hartonomous.client.make_config."""
        return dict(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                    top_p=self.top_p, repetition_penalty=self.repetition_penalty, seed=self.seed,
                    stop_strings=tuple(self.stop), stop_token_ids=tuple(self.stop_token_ids),
                    stop_at_eos=not self.ignore_eos)


class GenerateRequest(GenerationOptions):
    prompt: Prompt

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, prompt: str) -> str:
        return _not_blank(prompt)


class StreamRequest(GenerateRequest):
    details: bool = Field(False, description="Add token ids, probabilities, step times and the distribution "
                                             "to each event, and a final `event: result`.")
    top_n: int = Field(10, ge=0, le=100, description="With details: distribution rows per event.")


class BatchRequest(GenerationOptions):
    prompts: list[Prompt] = Field(min_length=1, max_length=MAX_BATCH)

    @field_validator("prompts")
    @classmethod
    def _prompts_not_blank(cls, prompts: list[str]) -> list[str]:
        for i, prompt in enumerate(prompts):
            if not prompt.strip():
                raise ValueError(f"prompt {i} is empty or only whitespace; pass some text to continue")
        return prompts


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


class GenerateResponse(BaseModel):
    path: PathName
    atom_set: str | None = None
    text: str
    token_ids: list[int]
    prompt_tokens: int
    state: str
    finish_reason: str
    seed: int
    timings: TimingsOut


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


class AtomSetsResponse(BaseModel):
    atom_sets: list[AtomSetOut]
    default: str | None = None


class ErrorResponse(BaseModel):
    error: str
