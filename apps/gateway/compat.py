"""The OpenAI wire shapes: /v1/chat/completions (request, `chat.completion`,
`chat.completion.chunk` stream) and the /v1/embeddings response.

Streams are bare `data: {json}` lines (no SSE event names) ending with
`data: [DONE]`: a first chunk with the assistant role, one chunk per text
delta, one per tool call (whole, with its index), a last chunk with the
finish_reason and, with `stream_options.include_usage`, a usage chunk with
no choices. A provider failure after the first byte is a chunk
`{"error": {"message", "type", "code"}}` (what the OpenAI SDKs raise as an
APIError) and no [DONE].
"""

from __future__ import annotations

import base64
import json
import struct
import time
from typing import Any

from apps.core.errors import ApplicationError
from apps.gateway.calls import ChatSpec, Reply, random_hex
from apps.gateway.convert import Conversation, bad_request, content_text, user_blocks
from apps.gateway.providers import Done, ProviderEvent, TextDelta, ThinkingDelta, ToolCall, ToolSpec, Usage
from apps.gateway.schemas import ChatCompletionIn

FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "length",
    "refusal": "content_filter",
}
EFFORTS = frozenset({"low", "medium", "high"})


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


# --- request ------------------------------------------------------------------------


def _arguments(raw: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError as exc:
        raise bad_request(f"{where}.function.arguments: not valid JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise bad_request(f"{where}.function.arguments: must be a JSON object")
    return value


def chat_spec(data: ChatCompletionIn) -> ChatSpec:
    if data.n not in (None, 1):
        raise bad_request("n: only 1 choice is supported")
    convo = Conversation()
    for i, m in enumerate(data.messages):
        where = f"messages[{i}]"
        if m.role == "user":  # the one role whose parts may be images
            convo.add_user_blocks(user_blocks(m.content, where))
            continue
        text = content_text(m.content, where)
        if m.role in ("system", "developer"):
            convo.add_system(text)
        elif m.role == "assistant":
            calls = [
                (c.id, c.function.name, _arguments(c.function.arguments, f"{where}.tool_calls[{j}]"))
                for j, c in enumerate(m.tool_calls or [])
            ]
            convo.add_assistant(text, calls)
        else:
            convo.add_tool_result(m.tool_call_id or "", text, where)
    tools = [ToolSpec(t.function.name, t.function.description, t.function.parameters) for t in data.tools or []]
    stop = [data.stop] if isinstance(data.stop, str) else data.stop
    sampling = {
        "temperature": data.temperature,
        "top_p": data.top_p,
        "frequency_penalty": data.frequency_penalty,
        "presence_penalty": data.presence_penalty,
        "seed": data.seed,
        "stop": stop or None,
    }
    effort = data.reasoning_effort if data.reasoning_effort in EFFORTS else ""
    request = convo.request(
        tools=tools, max_tokens=data.max_completion_tokens or data.max_tokens, sampling=sampling, effort=effort or ""
    )
    return ChatSpec(
        provider=data.loomcycle_provider or None,
        model=data.model or None,
        tier=data.loomcycle_tier or None,
        user_tier=data.loomcycle_user_tier or None,
        request=request,
    )


# --- response -------------------------------------------------------------------------


def new_completion_id() -> str:
    return f"chatcmpl-{random_hex(12)}"


def usage_out(usage: Usage | None) -> dict[str, Any]:
    """OpenAI counts cached prompt tokens inside prompt_tokens."""
    if usage is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    prompt = usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": usage.output_tokens,
        "total_tokens": prompt + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_input_tokens},
    }


def _tool_call_out(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": dumps(call.input)}}


def completion_body(*, completion_id: str, model: str, reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": "".join(reply.text) or None, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [_tool_call_out(c) for c in reply.calls]
    if reply.thinking:
        message["reasoning_content"] = "".join(reply.thinking)  # DeepSeek's field; clients ignore it
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": FINISH_REASONS.get(reply.stop_reason, "stop"),
            }
        ],
        "usage": usage_out(reply.done.usage if reply.done else None),
    }


class ChunkStream:
    """Provider events -> `chat.completion.chunk` frames for one streamed call."""

    def __init__(self, *, completion_id: str, model: str, include_usage: bool) -> None:
        self.id = completion_id
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage
        self.tool_index = 0
        self.done: Done | None = None

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        return f"data: {dumps(body)}\n\n".encode()

    def start(self) -> bytes:
        return self._chunk({"role": "assistant", "content": ""})

    def feed(self, event: ProviderEvent) -> bytes:
        if isinstance(event, TextDelta):
            return self._chunk({"content": event.text})
        if isinstance(event, ThinkingDelta):
            return self._chunk({"reasoning_content": event.text})
        if isinstance(event, ToolCall):
            index, self.tool_index = self.tool_index, self.tool_index + 1
            return self._chunk({"tool_calls": [{"index": index, **_tool_call_out(event)}]})
        self.done = event
        return b""

    def end(self) -> bytes:
        stop = self.done.stop_reason if self.done else "end_turn"
        out = self._chunk({}, FINISH_REASONS.get(stop, "stop"))
        if self.include_usage:
            body = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage_out(self.done.usage if self.done else None),
            }
            out += f"data: {dumps(body)}\n\n".encode()
        return out + b"data: [DONE]\n\n"

    @staticmethod
    def error(exc: ApplicationError) -> bytes:
        body = {"error": {"message": exc.message, "type": "provider_error", "code": exc.code}}
        return f"data: {dumps(body)}\n\n".encode()


# --- embeddings -------------------------------------------------------------------------


def embedding_out(vector: list[float], encoding_format: str) -> list[float] | str:
    """`base64`: the vector as little-endian float32 bytes, base64-encoded (OpenAI's packing)."""
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return vector


def embeddings_body(*, vectors: list[list[float]], model: str, encoding_format: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": embedding_out(v, encoding_format)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }
