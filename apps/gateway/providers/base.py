"""The provider interface (SPEC 7.1), independent of runs and definitions.

A driver turns a `ProviderRequest` into an iterator of events: text and
thinking deltas, tool calls, and one final `Done` with the stop reason and
usage. It must watch `cancel` (a threading.Event) while it waits and raise
`ProviderCancelled` promptly when it is set. Failures are `ProviderError`
with `retryable` set for 429, 5xx and transport errors.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Capabilities:
    streaming: bool = True
    parallel_tools: bool = True
    vision: bool = False
    thinking: bool = False
    max_context_tokens: int = 0


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True)
class ProviderRequest:
    """`messages` are provider-neutral: {"role": "user"|"assistant", "content": [blocks]}
    with blocks {"type": "text", "text"}, {"type": "tool_use", "id", "name", "input"},
    {"type": "tool_result", "tool_use_id", "content", "is_error"}."""

    model: str
    system: list[str]
    messages: list[dict[str, Any]]
    tools: list[ToolSpec] = field(default_factory=list)
    max_tokens: int = 4096
    sampling: dict[str, Any] = field(default_factory=dict)


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
    stop_reason: str
    usage: Usage


ProviderEvent = TextDelta | ThinkingDelta | ToolCall | Done


class ProviderError(Exception):
    """`<provider> <status>: <message>` (SPEC 7.1's classifiable error text)."""

    def __init__(self, provider: str, status: int, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(f"{provider} {status}: {message}")
        self.provider = provider
        self.status = status
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status == 429 or self.status >= 500 or self.status == 0


class ProviderCancelled(Exception):
    """The cancel event fired while the driver was waiting."""


class Provider(Protocol):
    id: str
    capabilities: Capabilities

    def stream(self, request: ProviderRequest, cancel: threading.Event) -> Iterator[ProviderEvent]: ...
