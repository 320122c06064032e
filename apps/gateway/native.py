"""loomcycle's native gateway shape, POST /v1/_llm/chat (SPEC 2.11).

Response: `{id: "llm_<16hex>", request_id, provider, model, content:
[{type: text, text} | {type: tool_use, id, name, input}], stop_reason, usage:
{input_tokens, output_tokens, cache_creation_input_tokens?,
cache_read_input_tokens?}}`.

Stream (named SSE events, Anthropic-style): `provider_chosen {provider,
model, request_id}`; per block `content_block_start {index, block}`,
`content_block_delta {index, delta: {type: text_delta, text}}` (text only),
`content_block_stop {index}` (a tool_use block arrives whole in its start
frame); then `message_delta {delta: {stop_reason}, usage}` and `done {id,
stop_reason, usage}`; a failure after the first byte is `error {type,
code, message}` instead of the closing frames. Block indexes start at 0
whatever the first block is.
"""

from __future__ import annotations

from typing import Any

from apps.core.errors import ApplicationError
from apps.gateway.calls import ChatSpec, Reply, random_hex
from apps.gateway.compat import dumps
from apps.gateway.convert import Conversation, content_text
from apps.gateway.providers import Done, ProviderEvent, TextDelta, ToolCall, ToolSpec, Usage
from apps.gateway.schemas import LlmChatIn


def chat_spec(data: LlmChatIn) -> ChatSpec:
    convo = Conversation()
    for i, m in enumerate(data.messages):
        where = f"messages[{i}]"
        text = content_text(m.content, where)
        if m.role == "system":
            convo.add_system(text)
        elif m.role == "user":
            convo.add_user(text)
        elif m.role == "assistant":
            convo.add_assistant(text, [(c.id, c.name, c.input) for c in m.tool_calls or []])
        else:
            convo.add_tool_result(m.tool_call_id or "", text, where)
    tools = [ToolSpec(t.name, t.description, t.input_schema) for t in data.tools or []]
    sampling = {"temperature": data.temperature, "stop": data.stop_sequences or None}
    return ChatSpec(
        provider=data.provider or None,
        model=data.model or None,
        tier=data.tier or None,
        user_tier=data.user_tier or None,
        request=convo.request(tools=tools, max_tokens=data.max_tokens, sampling=sampling),
    )


def new_llm_id() -> str:
    return f"llm_{random_hex(8)}"


def usage_out(usage: Usage | None) -> dict[str, int]:
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    out = {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
    if usage.cache_creation_input_tokens:
        out["cache_creation_input_tokens"] = usage.cache_creation_input_tokens
    if usage.cache_read_input_tokens:
        out["cache_read_input_tokens"] = usage.cache_read_input_tokens
    return out


def _tool_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}


def reply_body(*, request_id: str, provider: str, model: str, reply: Reply) -> dict[str, Any]:
    content = [
        {"type": "text", "text": b.text} if isinstance(b, TextDelta) else _tool_block(b)
        for b in reply.blocks
        if not (isinstance(b, TextDelta) and not b.text)
    ]
    return {
        "id": new_llm_id(),
        "request_id": request_id,
        "provider": provider,
        "model": model,
        "content": content,
        "stop_reason": reply.stop_reason,
        "usage": usage_out(reply.done.usage if reply.done else None),
    }


def frame(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {dumps(data)}\n\n".encode()


class FrameStream:
    """Provider events -> native SSE frames for one streamed call."""

    def __init__(self) -> None:
        self.next_index = 0
        self.open_index = -1
        self.done: Done | None = None

    def start(self, *, provider: str, model: str, request_id: str) -> bytes:
        return frame("provider_chosen", {"provider": provider, "model": model, "request_id": request_id})

    def _close(self) -> bytes:
        if self.open_index < 0:
            return b""
        out = frame("content_block_stop", {"index": self.open_index})
        self.open_index = -1
        return out

    def _open(self, block: dict[str, Any]) -> bytes:
        self.open_index, self.next_index = self.next_index, self.next_index + 1
        return frame("content_block_start", {"index": self.open_index, "block": block})

    def feed(self, event: ProviderEvent) -> bytes:
        if isinstance(event, TextDelta):
            out = b"" if self.open_index >= 0 else self._open({"type": "text"})
            delta = {"type": "text_delta", "text": event.text}
            return out + frame("content_block_delta", {"index": self.open_index, "delta": delta})
        if isinstance(event, ToolCall):
            return self._close() + self._open(_tool_block(event)) + self._close()
        if isinstance(event, Done):
            self.done = event
        return b""  # thinking is not part of this wire shape

    def end(self) -> bytes:
        stop = self.done.stop_reason if self.done else "end_turn"
        usage = usage_out(self.done.usage if self.done else None)
        return (
            self._close()
            + frame("message_delta", {"delta": {"stop_reason": stop}, "usage": usage})
            + frame("done", {"id": new_llm_id(), "stop_reason": stop, "usage": usage})
        )

    def error(self, exc: ApplicationError) -> bytes:
        return self._close() + frame("error", {"type": "provider_error", "code": exc.code, "message": exc.message})
