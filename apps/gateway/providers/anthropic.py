"""The Anthropic Messages API driver (SPEC 7.2), over the shared HTTP transport.

`build` turns a neutral `ProviderRequest` into `POST /v1/messages` with
`stream: true`; `AnthropicDecoder` turns the SSE events back into neutral
events. Wire rules this module encodes (Anthropic API reference):

- system is a list of text blocks; with `cache_system` the LAST one carries
  `cache_control: ephemeral`, which caches tools + system as one prefix;
- roles must alternate, so consecutive same-role messages are merged; in a
  user turn `tool_result` blocks must precede any text, in an assistant turn
  `thinking`/`redacted_thinking` blocks must come first (and are replayed
  byte-for-byte: the API rejects a modified or unsigned block);
- effort low/"" = no thinking, medium = 2048, high = 8192 budget tokens;
  max_tokens must exceed the budget, and extended thinking refuses a custom
  temperature or top_k (and top_p below 0.95), so those are dropped then;
- frequency_penalty, presence_penalty and seed do not exist here: dropped;
- a mid-stream `error` event maps to the status the same error has as an
  HTTP answer (overloaded_error 529, rate_limit_error 429, api_error 500).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar

from apps.gateway.providers.base import (
    Capabilities,
    Done,
    ProviderError,
    ProviderEvent,
    ProviderRequest,
    TextDelta,
    ThinkingDelta,
    ToolCall,
    Usage,
)
from apps.gateway.providers.http import Decoder, Frame, HttpCall, ProviderConfig, WireProtocol, parse_json

log = logging.getLogger("loomcycle.gateway")

API_VERSION = "2023-06-01"
EFFORT_BUDGET = {"medium": 2048, "high": 8192}  # "" and "low": no thinking
SAMPLING_KEYS = ("temperature", "top_p", "top_k")  # frequency/presence_penalty, seed: not Anthropic's
MIN_THINKING_TOP_P = 0.95
STOP_REASONS = {
    "end_turn": "end_turn",
    "tool_use": "tool_use",
    "max_tokens": "max_tokens",
    "stop_sequence": "stop_sequence",
    "refusal": "refusal",
    "pause_turn": "end_turn",  # a server tool paused the turn; we run no server tools
    "model_context_window_exceeded": "max_tokens",
}
STREAM_ERROR_STATUS = {"overloaded_error": 529, "rate_limit_error": 429, "api_error": 500}
THINKING_TYPES = ("thinking", "redacted_thinking")


# --- request ----------------------------------------------------------------


def _system(request: ProviderRequest) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": s} for s in request.system if s]
    if blocks and request.cache_system:
        blocks[-1]["cache_control"] = {"type": "ephemeral"}
    return blocks


def _tool_result_content(content: Any) -> Any:
    if isinstance(content, list):
        return [_block(b, "user") for b in content if _keep(b, "user")]
    return "" if content is None else str(content)


def _keep(block: dict[str, Any], role: str) -> bool:
    """Empty text blocks are refused by the API; reasoning is replayed only in
    assistant turns and only when signed (unsigned came from another provider)."""
    kind = block.get("type")
    if kind == "text":
        return bool(block.get("text"))
    if kind == "thinking":
        return role == "assistant" and bool(block.get("signature"))
    if kind == "redacted_thinking":
        return role == "assistant" and bool(block.get("data"))
    return True


def _block(block: dict[str, Any], role: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        if block.get("cacheable"):  # a caller's cache breakpoint (a `cacheable` trusted-text prompt block)
            return {"type": "text", "text": block["text"], "cache_control": {"type": "ephemeral"}}
        return {"type": "text", "text": block["text"]}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block["id"], "name": block["name"], "input": block.get("input") or {}}
    if kind == "tool_result":
        return {
            "type": "tool_result",
            "tool_use_id": block["tool_use_id"],
            "content": _tool_result_content(block.get("content")),
            "is_error": bool(block.get("is_error")),
        }
    if kind == "thinking":
        return {"type": "thinking", "thinking": block.get("thinking", ""), "signature": block["signature"]}
    if kind == "redacted_thinking":
        return {"type": "redacted_thinking", "data": block["data"]}
    if kind == "image":
        source = {"type": "base64", "media_type": block["media_type"], "data": block["data"]}
        return {"type": "image", "source": source}
    raise ValueError(f"unsupported {role} content block type {kind!r}")


def _messages(request: ProviderRequest) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for message in request.messages:
        role = message["role"]
        content = message["content"]
        raw = [{"type": "text", "text": content}] if isinstance(content, str) else content
        blocks = [_block(b, role) for b in raw if _keep(b, role)]
        if not blocks:
            continue
        if merged and merged[-1]["role"] == role:  # the API requires user/assistant alternation
            merged[-1]["content"].extend(blocks)
        else:
            merged.append({"role": role, "content": blocks})
    for message in merged:
        # tool results before text in a user turn, reasoning first in an assistant turn (stable)
        lead = ("tool_result",) if message["role"] == "user" else THINKING_TYPES
        message["content"].sort(key=lambda b: 0 if b["type"] in lead else 1)
    return merged


def _sampling(request: ProviderRequest, thinking: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in SAMPLING_KEYS:
        value = request.sampling.get(key)
        if value is None:
            continue
        if thinking and (key != "top_p" or float(value) < MIN_THINKING_TOP_P):
            log.info("anthropic: dropped %s=%r, incompatible with extended thinking (effort)", key, value)
            continue
        out[key] = value
    stop = request.sampling.get("stop")
    if stop:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return out


def build_body(request: ProviderRequest) -> dict[str, Any]:
    budget = EFFORT_BUDGET.get(request.effort, 0)
    max_tokens = request.max_tokens
    if budget and max_tokens <= budget:  # budget must stay below max_tokens; keep the answer's own room
        max_tokens = budget + request.max_tokens
    body: dict[str, Any] = {"model": request.model, "max_tokens": max_tokens}
    system = _system(request)
    if system:
        body["system"] = system
    body["messages"] = _messages(request)
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema} for t in request.tools
        ]
    body["stream"] = True
    body.update(_sampling(request, thinking=bool(budget)))
    if budget:
        body["thinking"] = {"type": "enabled", "budget_tokens": budget}
    return body


# --- response ---------------------------------------------------------------


@dataclass
class _Block:
    kind: str
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)  # text, thinking or partial JSON
    signature: list[str] = field(default_factory=list)  # signature_delta pieces
    start_signature: str = ""  # a signature already present in content_block_start
    data: str = ""  # redacted_thinking payload (complete in content_block_start, no deltas)


class AnthropicDecoder(Decoder):
    def __init__(self, config: ProviderConfig, request: ProviderRequest) -> None:
        self.provider = config.id
        self.model = request.model
        self.usage: dict[str, int] = {}
        self.blocks: dict[int, _Block] = {}
        self.thinking: list[dict[str, Any]] = []
        self.stop_reason = ""
        self.saw_tool_call = False
        self.done = False

    def feed(self, frame: Frame) -> list[ProviderEvent]:
        if self.done:
            return []
        doc = parse_json(self.provider, frame.data)
        if not isinstance(doc, dict):
            raise ProviderError(self.provider, 502, f"malformed stream frame: {frame.data[:200]!r}")
        kind = doc.get("type") or frame.event
        if kind == "message_start":
            message = doc.get("message")
            self._usage(message.get("usage") if isinstance(message, dict) else None)
        elif kind == "content_block_start":
            return self._start(doc)
        elif kind == "content_block_delta":
            return self._delta(doc)
        elif kind == "content_block_stop":
            return self._stop(doc)
        elif kind == "message_delta":
            self.stop_reason = (doc.get("delta") or {}).get("stop_reason") or self.stop_reason
            self._usage(doc.get("usage"))
        elif kind == "message_stop":
            self.done = True
            return [self._done()]
        elif kind == "error":
            raise self._error(doc)
        return []  # ping, and event types added after this was written (versioning policy)

    def finish(self) -> list[ProviderEvent]:
        if not self.done:
            raise ProviderError(self.provider, 0, "stream ended before message_stop")
        return []

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        for key in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"):
            if isinstance(usage.get(key), int):  # message_delta's counts are cumulative: overwrite
                self.usage[key] = usage[key]

    def _start(self, doc: dict[str, Any]) -> list[ProviderEvent]:
        raw = doc.get("content_block") or {}
        block = _Block(kind=str(raw.get("type", "")), id=str(raw.get("id", "")), name=str(raw.get("name", "")))
        self.blocks[int(doc.get("index", 0))] = block
        if block.kind == "text" and raw.get("text"):
            block.parts.append(raw["text"])
            return [TextDelta(raw["text"])]
        if block.kind == "tool_use" and raw.get("input"):
            block.parts.append(json.dumps(raw["input"]))
        elif block.kind == "thinking":
            block.start_signature = str(raw.get("signature") or "")
            if raw.get("thinking"):
                block.parts.append(raw["thinking"])
                return [ThinkingDelta(raw["thinking"])]
        elif block.kind == "redacted_thinking":
            block.data = str(raw.get("data", ""))
        return []

    def _delta(self, doc: dict[str, Any]) -> list[ProviderEvent]:
        delta = doc.get("delta") or {}
        kind = delta.get("type")
        if kind not in ("text_delta", "thinking_delta", "input_json_delta", "signature_delta"):
            return []  # citations_delta and newer delta types carry nothing we use
        block = self.blocks.get(int(doc.get("index", 0)))
        if block is None:
            raise ProviderError(self.provider, 502, f"{kind} for a block that never started: {str(doc)[:200]}")
        if kind == "signature_delta":
            block.signature.append(str(delta.get("signature", "")))
            return []
        piece = str(delta.get({"text_delta": "text", "thinking_delta": "thinking"}.get(kind, "partial_json"), ""))
        block.parts.append(piece)
        if not piece or kind == "input_json_delta":
            return []
        return [TextDelta(piece) if kind == "text_delta" else ThinkingDelta(piece)]

    def _stop(self, doc: dict[str, Any]) -> list[ProviderEvent]:
        block = self.blocks.pop(int(doc.get("index", 0)), None)
        if block is None:
            return []
        if block.kind == "tool_use":
            raw = "".join(block.parts).strip()
            args = parse_json(self.provider, raw) if raw else {}
            if not isinstance(args, dict):
                raise ProviderError(self.provider, 502, f"tool input is not an object: {raw[:200]!r}")
            self.saw_tool_call = True
            return [ToolCall(id=block.id, name=block.name, input=args)]
        if block.kind == "thinking":
            signature = "".join(block.signature) or block.start_signature
            self.thinking.append({"type": "thinking", "thinking": "".join(block.parts), "signature": signature})
        elif block.kind == "redacted_thinking":
            self.thinking.append({"type": "redacted_thinking", "data": block.data})
        return []

    def _done(self) -> Done:
        fallback = "tool_use" if self.saw_tool_call else "end_turn"
        usage = Usage(
            input_tokens=self.usage.get("input_tokens", 0),
            output_tokens=self.usage.get("output_tokens", 0),
            cache_creation_input_tokens=self.usage.get("cache_creation_input_tokens", 0),
            cache_read_input_tokens=self.usage.get("cache_read_input_tokens", 0),
            model=self.model,
            provider=self.provider,
        )
        return Done(STOP_REASONS.get(self.stop_reason, fallback), usage, tuple(self.thinking))

    def _error(self, doc: dict[str, Any]) -> ProviderError:
        raw = doc.get("error")
        err: dict[str, Any] = raw if isinstance(raw, dict) else {}
        kind = str(err.get("type") or "error")
        message = f"{kind}: {err.get('message') or '(no message)'}"
        return ProviderError(self.provider, STREAM_ERROR_STATUS.get(kind, 400), message)


# --- protocol ---------------------------------------------------------------


class AnthropicProtocol(WireProtocol):
    framing: ClassVar[str] = "sse"
    sampling_knobs: ClassVar[frozenset[str]] = frozenset({*SAMPLING_KEYS, "stop"})
    capabilities: ClassVar[Capabilities] = Capabilities(
        streaming=True,
        parallel_tools=True,
        vision=True,
        thinking=True,
        max_context_tokens=200_000,
        native_prompt_cache=True,
        effort=True,
    )

    def unsent_sampling(self, sampling: dict[str, Any], effort: str) -> list[str]:
        """Also what extended thinking (an effort with a budget) makes _sampling drop."""
        unsent = set(super().unsent_sampling(sampling, effort))
        if EFFORT_BUDGET.get(effort, 0):
            for key in SAMPLING_KEYS:
                value = sampling.get(key)
                if value is not None and (key != "top_p" or float(value) < MIN_THINKING_TOP_P):
                    unsent.add(key)
        return sorted(unsent)

    def build(self, config: ProviderConfig, request: ProviderRequest) -> HttpCall:
        headers = {
            "anthropic-version": API_VERSION,
            "content-type": "application/json",
            "accept": "text/event-stream",
        }
        if config.api_key:
            headers["x-api-key"] = config.api_key
        try:
            body = build_body(request)
        except (KeyError, ValueError) as exc:  # a malformed neutral block: the call can never succeed
            raise ProviderError(config.id, 400, f"cannot translate the request: {exc!r}") from exc
        return HttpCall(url=f"{config.base_url.rstrip('/')}/v1/messages", headers=headers, body=body)

    def decoder(self, config: ProviderConfig, request: ProviderRequest) -> Decoder:
        return AnthropicDecoder(config, request)

    def error_message(self, body: bytes) -> str:
        """`{"type": "error", "error": {"type", "message"}, "request_id"}` -> "<type>: <message>"."""
        try:
            doc = json.loads(body)
        except ValueError:
            return super().error_message(body)
        err = doc.get("error") if isinstance(doc, dict) else None
        if not isinstance(err, dict) or not err.get("message"):
            return super().error_message(body)
        text = f"{err.get('type') or 'error'}: {err['message']}"
        return f"{text} (request_id {doc['request_id']})" if doc.get("request_id") else text
