"""The provider interface (SPEC 7.1), independent of runs and definitions.

A driver turns a `ProviderRequest` into an iterator of events: text and
thinking deltas, tool calls, and one final `Done` with the stop reason and
usage. `stream` (the worker's path) must watch `cancel` (a threading.Event)
while it waits and raise `ProviderCancelled` promptly when it is set;
`astream` (the gateway's path, on the web's event loop) is cancelled by
cancelling its task. Failures are `ProviderError` with `retryable` set for
429, 5xx and transport errors (status 0).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Capabilities:
    streaming: bool = True
    parallel_tools: bool = True
    vision: bool = False
    thinking: bool = False
    max_context_tokens: int = 0
    native_prompt_cache: bool = False
    effort: bool = False
    # The call waits on the network. The engine then gives its admission slot
    # (apps.runs.engine.admission) to the next iteration for the call's duration; an
    # in-process provider (the mock) marks its own waits instead (apps.gateway.waits).
    remote: bool = True


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]


PURPOSE_COMPACTION = "compaction"


@dataclass(frozen=True)
class ProviderRequest:
    """`messages` are provider-neutral: {"role": "user"|"assistant", "content": [blocks]}
    with blocks {"type": "text", "text"}, {"type": "tool_use", "id", "name", "input"},
    {"type": "tool_result", "tool_use_id", "content", "is_error"}, {"type": "image",
    "media_type", "data"} (user turns; standard base64) and, in
    assistant turns, {"type": "thinking", "thinking", "signature"} (replayed to
    the provider that produced it, dropped by the others). A user text block
    may carry `cacheable: true`: a prompt-cache breakpoint (Anthropic
    `cache_control`), ignored by drivers without a native cache.

    `system` blocks are trusted text; with `cache_system` a driver with a
    native prompt cache marks them cacheable (Anthropic `cache_control`).
    `sampling` keys: temperature, top_p, top_k, frequency_penalty,
    presence_penalty, seed, stop. `effort`: "" | low | medium | high."""

    model: str
    system: list[str]
    messages: list[dict[str, Any]]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 4096
    sampling: dict[str, Any] = field(default_factory=dict)
    effort: str = ""
    cache_system: bool = True
    # The run the call is for ("" outside a run, e.g. the gateway); drivers
    # send it nowhere, the mock derives deterministic tool ids from it.
    run_id: str = ""
    # What the call is for: "" a model turn, PURPOSE_COMPACTION a context summary
    # (apps.runs.compaction.plan). Drivers send it nowhere; the mock answers a summary.
    purpose: str = ""


@dataclass(frozen=True)
class Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0
    model: str = ""
    provider: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cache_creation_input_tokens": self.cache_creation_input_tokens,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "model": self.model,
            "provider": self.provider,
        }


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ThinkingDelta:
    text: str


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    input: dict[str, Any]


@dataclass(frozen=True)
class Done:
    """`stop_reason` is normalised to end_turn | tool_use | max_tokens |
    stop_sequence | refusal; `thinking` holds the turn's reasoning blocks
    ({"type": "thinking", "thinking", "signature"}) to replay next turn."""

    stop_reason: str
    usage: Usage
    thinking: tuple[dict[str, Any], ...] = ()


ProviderEvent = TextDelta | ThinkingDelta | ToolCall | Done


class ProviderError(Exception):
    """`<provider> <status>: <message>` (SPEC 7.1's classifiable error text)."""

    def __init__(
        self, provider: str, status: int, message: str, *, retry_after: float | None = None, stop_reason: str = ""
    ) -> None:
        # status 0 = transport failure (connect, timeout, broken stream): "<provider> http: ..."
        super().__init__(f"{provider} {status}: {message}" if status else f"{provider} http: {message}")
        self.message = message
        self.provider = provider
        self.status = status
        self.retry_after = retry_after
        # The failed run's stop_reason when the error names one (the mock's invalid script); usually "".
        self.stop_reason = stop_reason

    @property
    def retryable(self) -> bool:
        return self.status == 429 or self.status >= 500 or self.status == 0


class ProviderCancelled(Exception):
    """The cancel event fired while the driver was waiting."""


SAMPLING_KNOBS = frozenset({"temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty", "seed", "stop"})


class Provider(ABC):
    id: str
    capabilities: Capabilities

    def unsent_sampling(self, sampling: dict[str, Any], effort: str) -> list[str]:
        """The knobs of `sampling` (set, not None) this provider's requests will not carry, so
        the run can report them (capability_inert) instead of dropping them silently. The
        default: none (the mock takes every knob; it samples nothing, its answers are scripted)."""
        return []

    def check_model(self, model: str) -> None:  # noqa: B027 -- a hook with a default, not abstract
        """Raise ValueError for a model string this provider refuses before any
        call (the mock's malformed options); most providers accept any name."""

    @abstractmethod
    def stream(self, request: ProviderRequest, cancel: threading.Event) -> Iterator[ProviderEvent]:
        """Blocking, for worker threads; honours `cancel`."""

    @abstractmethod
    def astream(self, request: ProviderRequest) -> AsyncIterator[ProviderEvent]:
        """The same events on an event loop (an async generator)."""
