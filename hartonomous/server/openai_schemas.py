"""The /v1 request bodies (OpenAI's field names, ranges and defaults) and OpenAI's error shape.

OpenAI's sampler defaults apply here, not /api's: temperature 1, top_p 1, no top-k, no repetition
penalty. The project's own options are extension fields (EXTENSIONS; docs/openai.md). A field that
is neither OpenAI's nor an extension is a 400 naming it; an OpenAI field this server does not
implement (tools, response_format, logit_bias, ...) is a 400 naming it when it is given.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hartonomous.paths import PATHS

MAX_TOKENS = 512               # the server's cap on one request's new tokens (as /api's max_new_tokens)
MAX_STOP = 4                   # OpenAI's limit on stop sequences
MAX_LOGPROBS = 5               # completions: OpenAI's limit on `logprobs`
MAX_TOP_LOGPROBS = 20          # chat: OpenAI's limit on `top_logprobs`
MAX_PROMPT_CHARS = 32_000      # characters of one prompt or of all messages' content together
INT64 = 2**63
EXTENSIONS = ("atom_set", "path", "memory", "top_k", "repetition_penalty", "cite")
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "response_format",
               "logit_bias", "suffix", "modalities", "audio", "prediction", "web_search_options")


class OpenAIError(Exception):
    """An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with `status`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(param: str | None, message: str, code: str | None = None) -> OpenAIError:
    """A 400 invalid_request_error naming `param`."""
    return OpenAIError(400, message, param, code)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


Stop = Annotated[str, Field(min_length=1, max_length=200)]


class Common(BaseModel):
    """Fields both endpoints share: OpenAI's, then the project's extensions."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=300)
    temperature: float = Field(1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0, le=1, allow_inf_nan=False)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: Stop | list[Stop] | None = None
    seed: int | None = Field(None, ge=-INT64, le=INT64 - 1)
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    user: str | None = None                      # accepted and ignored
    store: bool | None = None                    # accepted and ignored (nothing is stored for a client)
    metadata: dict[str, str] | None = None       # accepted and ignored
    # Project extensions (docs/openai.md).
    atom_set: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[^\x00]*$")
    path: Literal[PATHS] | None = None
    memory: bool = False                         # the response says what the server's memory did with it
    top_k: int | None = Field(None, ge=0, le=1_000_000)
    repetition_penalty: float = Field(1.0, ge=1e-6, le=100, allow_inf_nan=False)
    cite: bool = False                           # each store-picked token's files and lines (docs/openai.md)
    # OpenAI fields this server does not implement: a 400 naming them when given (check()).
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    logit_bias: Any = None
    suffix: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    web_search_options: Any = None

    def check(self) -> None:
        """OpenAI's rules this server keeps as clear 400s instead of silent approximations."""
        for name in UNSUPPORTED:
            if getattr(self, name) not in (None, [], {}):
                raise invalid(name, f"{name} is not supported by this server; drop it")
        if self.n != 1:
            raise invalid("n", f"n must be 1 (one choice per request), got {self.n}")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0:
                raise invalid(name, f"{name} is additive and this server's repetition penalty is multiplicative; "
                                    f"send {name}=0 and use the extension field repetition_penalty (1 = off)")
        if self.stream_options is not None and not self.stream:
            raise invalid("stream_options", "stream_options is only allowed with stream=true")
        if len(self.stops()) > MAX_STOP:
            raise invalid("stop", f"stop takes at most {MAX_STOP} sequences, got {len(self.stops())}")

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(Common):
    """POST /v1/completions."""

    prompt: Annotated[str, Field(max_length=MAX_PROMPT_CHARS)] | list[Annotated[int, Field(ge=0, lt=2**31)]]
    max_tokens: int | None = Field(16, ge=1, le=MAX_TOKENS)
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    best_of: int | None = None

    def check(self) -> None:
        super().check()
        if self.best_of not in (None, 1):
            raise invalid("best_of", f"best_of must be 1 (one choice per request), got {self.best_of}")
        if (isinstance(self.prompt, str) and not self.prompt.strip()) or (not isinstance(self.prompt, str)
                                                                          and not self.prompt):
            raise invalid("prompt", "the prompt is empty; pass some text (or token ids) to continue")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict] | None = None
    name: str | None = None

    def text(self, index: int) -> str:
        """The message's text; images, audio and files are a 400 naming the part."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        pieces = []
        for j, part in enumerate(self.content):
            kind = part.get("type")
            if kind != "text":
                raise invalid(f"messages[{index}].content[{j}]", f"content parts of type {kind!r} (images, audio, "
                                                                 "files) are not supported; send text only")
            try:
                pieces.append(TextPart(**part).text)
            except ValidationError as exc:
                raise invalid(f"messages[{index}].content[{j}]", _first(exc)[1]) from exc
        return "".join(pieces)


class ChatRequest(Common):
    """POST /v1/chat/completions."""

    messages: list[Message] = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def check(self) -> None:
        super().check()
        if self.top_logprobs is not None and not self.logprobs:
            raise invalid("top_logprobs", "top_logprobs needs logprobs=true")
        total = sum(len(m.content) if isinstance(m.content, str) else 0 for m in self.messages)
        if total > MAX_PROMPT_CHARS:
            raise invalid("messages", f"the messages hold {total} characters; at most {MAX_PROMPT_CHARS}")

    def new_tokens(self) -> int:
        """max_completion_tokens, else max_tokens, else the server's cap (the context limits it too)."""
        return self.max_completion_tokens or self.max_tokens or MAX_TOKENS

    def chat(self) -> list[dict]:
        """The messages as the chat template takes them (developer is the template's system role)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text(i)}
                for i, m in enumerate(self.messages)]


def parse(raw: bytes, model: type[Common]) -> Common:
    """A request body as `model`, checked; any problem is a 400 naming the field (never a 422)."""
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise invalid(None, "the body is not valid JSON; send a JSON object (Content-Type: application/json)") \
            from exc
    if not isinstance(data, dict):
        raise invalid(None, "the body must be a JSON object")
    try:
        request = model.model_validate(data)
    except ValidationError as exc:
        param, message = _first(exc)
        raise invalid(param, message) from exc
    request.check()
    return request


def _first(exc: ValidationError) -> tuple[str, str]:
    """(param, message) of a validation error's first entry, OpenAI's wording for unknown fields."""
    error = exc.errors()[0]
    loc = []
    for part in error.get("loc", ()):
        if isinstance(part, str) and (not part.isidentifier() or part in ("str", "int", "list")):
            break                         # a union's branch tag: the field itself is the param
        loc.append(part)
    param = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc)) or None
    if error.get("type") == "extra_forbidden":
        return param, (f"unrecognized request argument supplied: {param}; the extensions are "
                       f"{', '.join(EXTENSIONS)} (docs/openai.md)")
    return param, f"{param}: {error.get('msg', 'invalid value')}" if param else error.get("msg", "invalid value")
