"""Request bodies of the gateway endpoints (SPEC 2.11).

OpenAI-shaped bodies accept, and ignore, every field they do not declare
(`response_format`, `logit_bias`, `logprobs`, `top_logprobs`,
`parallel_tool_calls`, `metadata`, `store`, `service_tier`, `modalities`,
`audio`, `prediction`, `web_search_options`, `dimensions`, ...): an OpenAI
SDK or framework that sends them keeps working. docs/api.md (LLM gateway) lists them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


# --- shared -------------------------------------------------------------------


class ImageUrlIn(_Lenient):
    url: str = Field(max_length=16 * 1024 * 1024)  # a data: URL or http(s); apps.gateway.images checks it
    detail: str | None = None  # accepted; no driver has a knob for it


class ContentPartIn(_Lenient):
    """A content part: `text` (and an assistant's `refusal`) carry text; a user's
    `image_url` an image (apps.gateway.convert). Any other type is refused."""

    type: str
    text: str | None = None
    refusal: str | None = None
    image_url: ImageUrlIn | None = None


Content = str | list[ContentPartIn] | None


# --- POST /v1/chat/completions (OpenAI Chat Completions) -----------------------


class FunctionCallIn(_Lenient):
    name: str
    arguments: str = ""  # a JSON string, as OpenAI sends it


class ToolCallIn(_Lenient):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessageIn(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class FunctionIn(_Lenient):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolIn(_Lenient):
    type: Literal["function"] = "function"
    function: FunctionIn


class StreamOptionsIn(_Lenient):
    include_usage: bool = False


class ChatCompletionIn(_Lenient):
    model: str = ""
    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list[ToolIn] | None = None
    tool_choice: Any = None  # accepted; the drivers let the model choose
    stream: bool = False
    stream_options: StreamOptionsIn | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    reasoning_effort: str | None = None
    user: str | None = None
    n: int | None = None
    loomcycle_provider: str | None = None
    loomcycle_tier: str | None = None
    loomcycle_user_id: str | None = None
    loomcycle_user_tier: str | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > 4:
            raise ValueError("at most 4 stop sequences")
        return value


# --- POST /v1/_llm/chat (loomcycle native) --------------------------------------


class LlmToolCallIn(_Lenient):
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class LlmMessageIn(_Lenient):
    role: Literal["system", "user", "assistant", "tool"]
    content: Content = None
    tool_calls: list[LlmToolCallIn] | None = None
    tool_call_id: str | None = None


class LlmToolIn(_Lenient):
    name: str = Field(min_length=1, max_length=128)
    description: str = ""
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class LlmChatIn(_Lenient):
    messages: list[LlmMessageIn] = Field(min_length=1)
    tools: list[LlmToolIn] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    stop_sequences: list[str] | None = None
    stream: bool = False
    provider: str | None = None
    model: str | None = None
    tier: str | None = None
    user_id: str | None = None
    user_tier: str | None = None


# --- POST /v1/embeddings ----------------------------------------------------------

MAX_EMBEDDING_INPUTS = 2048  # OpenAI's own limit per request


class EmbeddingsIn(_Lenient):
    # Documented as `_texts` checks it: a string or 1..MAX_EMBEDDING_INPUTS strings.
    input: Any = Field(
        json_schema_extra={
            "anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS},
            ]
        }
    )
    model: str = ""
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None  # accepted, ignored: the embedder has one size
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _texts(cls, value: Any) -> Any:
        if isinstance(value, str):
            return value
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            if len(value) > MAX_EMBEDDING_INPUTS:
                raise ValueError(f"at most {MAX_EMBEDDING_INPUTS} inputs per request")
            return value
        if isinstance(value, list) and value and all(isinstance(v, int | list) for v in value):
            raise ValueError("token arrays are not supported; send text (a string or a list of strings)")
        raise ValueError("must be a string or a non-empty list of strings")

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class ModelOut(BaseModel):
    """One entry of GET /v1/models, OpenAI's `Model` object."""

    id: str
    object: Literal["model"] = "model"
    created: int  # OpenAI's epoch seconds; 0: configuration, not a release date
    owned_by: str  # the provider that serves it


class ModelsOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]


# --- JSON answers of the calls (apps.gateway.compat, native): documented for /v1/openapi.json ---


class _Open(BaseModel):
    """Provider-shaped objects may carry more fields than those named (OpenAI adds them over time)."""

    model_config = ConfigDict(extra="allow")


class CompletionMessageOut(_Open):
    role: str  # "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[dict[str, Any]] | None = None  # [{id, type: "function", function: {name, arguments}}]
    reasoning_content: str | None = None  # the model's thinking, when it streamed any (DeepSeek's field)


class CompletionChoiceOut(_Open):
    index: int
    message: CompletionMessageOut
    logprobs: Any = None
    finish_reason: str


class ChatCompletionOut(_Open):
    """OpenAI's `chat.completion` (stream:false)."""

    id: str
    object: str  # "chat.completion"
    created: int
    model: str
    choices: list[CompletionChoiceOut]
    usage: dict[str, Any]  # prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details


class LlmChatOut(_Open):
    """The native gateway's JSON answer (stream:false): content blocks as the providers' messages hold them."""

    id: str
    request_id: str
    provider: str
    model: str
    content: list[dict[str, Any]]  # {type: "text", text} | {type: "tool_use", id, name, input}
    stop_reason: str | None
    usage: dict[str, Any]


class EmbeddingOut(_Open):
    object: str  # "embedding"
    index: int
    embedding: list[float] | str  # a base64 string when encoding_format is base64


class EmbeddingsOut(_Open):
    """OpenAI's embeddings list."""

    object: str  # "list"
    data: list[EmbeddingOut]
    model: str
    usage: dict[str, Any]
