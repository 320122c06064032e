"""The OpenAI Chat Completions driver (SPEC 7.2): OpenAI, DeepSeek and any
OpenAI-compatible server (vLLM, LiteLLM, llama.cpp, ...), over the shared
HTTP transport.

`build` turns a neutral `ProviderRequest` into `POST {base_url}/chat/completions`
with `stream: true`; `OpenAIDecoder` turns the SSE chunks back into neutral
events. Wire rules this module encodes (OpenAI Chat Completions reference,
DeepSeek API docs):

- all system blocks become ONE leading `system` message;
- an assistant turn is one message: its text as `content` (omitted when the
  turn is only tool calls) and `tool_calls` with the input as a JSON string;
- each `tool_result` becomes its own `tool` message, placed before any user
  text of the same turn (the API wants the tool messages right after the
  assistant's `tool_calls`); `content` is always sent, even when empty
  (DeepSeek refuses a tool message without it); an error result is prefixed
  with "ERROR: " so the model sees it failed;
- thinking blocks are dropped, except that the "deepseek" dialect (or any
  endpoint with `options.replay_reasoning: true`) sends an assistant turn that
  made tool calls back with `reasoning_content`, "" when no reasoning was
  recorded: DeepSeek's thinking mode answers 400 when a tool-call turn lacks
  it, and ignores it on other turns, so those never carry it (the legacy
  deepseek-reasoner, which refused it anywhere, made no tool calls);
- dialect "openai": `max_completion_tokens`, effort -> `reasoning_effort`;
  "deepseek" and "compat": `max_tokens`, no effort knob; "compat" omits
  `stream_options` when `options.stream_usage` is false (servers that refuse it);
- tool calls stream as fragments keyed by `index` and are emitted whole at
  the end; `finish_reason` maps stop -> end_turn, tool_calls -> tool_use,
  length -> max_tokens, content_filter -> refusal; the stream ends at
  `data: [DONE]` (or with a finish_reason, for servers that never send it).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field, replace
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

ERROR_PREFIX = "ERROR: "
SAMPLING_KEYS = ("temperature", "top_p", "frequency_penalty", "presence_penalty", "seed", "stop")
FINISH_REASONS = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "function_call": "tool_use",  # the pre-tools name some servers still send
    "length": "max_tokens",
    "content_filter": "refusal",
}


# --- request ----------------------------------------------------------------


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content or [])


def result_text(block: dict[str, Any]) -> str:
    """A tool_result's content (a string or a list of text blocks) as text, an
    error prefixed with "ERROR: " (no error flag on this wire: the model must read it)."""
    content = block.get("content")
    if isinstance(content, list):
        text = "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    else:
        text = "" if content is None else str(content)
    return ERROR_PREFIX + text if block.get("is_error") else text


def _assistant(provider_id: str, blocks: list[dict[str, Any]], replay_reasoning: bool) -> dict[str, Any]:
    text: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(
                {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}
            )
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue  # opaque to everyone but Anthropic
        else:
            raise ProviderError(provider_id, 400, f"unsupported content block {kind!r} in an assistant message")
    message: dict[str, Any] = {"role": "assistant"}
    if text or not calls:
        message["content"] = "".join(text)
    if calls:
        message["tool_calls"] = calls
        if replay_reasoning:
            message["reasoning_content"] = "".join(reasoning)
    return message


def _user(provider_id: str, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "tool_result":
            tools.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result_text(block)})
        elif kind == "text":
            if block.get("text"):
                parts.append({"type": "text", "text": str(block["text"])})
        elif kind == "image":
            url = f"data:{block['media_type']};base64,{block['data']}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise ProviderError(provider_id, 400, f"unsupported content block {kind!r} in a user message")
    if not parts:
        return tools
    if all(p["type"] == "text" for p in parts):
        return [*tools, {"role": "user", "content": "\n\n".join(p["text"] for p in parts)}]
    return [*tools, {"role": "user", "content": parts}]


def replays_reasoning(config: ProviderConfig) -> bool:
    return bool(config.options.get("replay_reasoning", config.dialect == "deepseek"))


def openai_messages(config: ProviderConfig, request: ProviderRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = "\n\n".join(s for s in request.system if s)
    if system:
        out.append({"role": "system", "content": system})
    replay = replays_reasoning(config)
    for message in request.messages:
        if message["role"] == "assistant":
            out.append(_assistant(config.id, _blocks(message), replay))
        else:
            out.extend(_user(config.id, _blocks(message)))
    return out


def openai_tools(request: ProviderRequest) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.input_schema}}
        for t in request.tools
    ]


class OpenAIProtocol(WireProtocol):
    framing: ClassVar[str] = "sse"
    sampling_knobs: ClassVar[frozenset[str]] = frozenset(SAMPLING_KEYS)  # no top_k in Chat Completions
    # Per model in truth; a yaml `capabilities:` block narrows it for one endpoint.
    capabilities: ClassVar[Capabilities] = Capabilities(
        streaming=True, parallel_tools=True, vision=True, thinking=True, max_context_tokens=128_000, effort=True
    )

    def build(self, config: ProviderConfig, request: ProviderRequest) -> HttpCall:
        dialect = config.dialect or "compat"
        body: dict[str, Any] = {"model": request.model, "messages": openai_messages(config, request), "stream": True}
        if request.tools:
            body["tools"] = openai_tools(request)
        if dialect != "compat" or config.options.get("stream_usage", True):
            body["stream_options"] = {"include_usage": True}
        if request.max_tokens > 0:
            body["max_completion_tokens" if dialect == "openai" else "max_tokens"] = request.max_tokens
        for key in SAMPLING_KEYS:
            if request.sampling.get(key) is not None:
                body[key] = request.sampling[key]
        if request.effort and dialect == "openai":
            body["reasoning_effort"] = request.effort
        headers = {"Accept": "text/event-stream"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        return HttpCall(url=f"{config.base_url}/chat/completions", headers=headers, body=body)

    def decoder(self, config: ProviderConfig, request: ProviderRequest) -> Decoder:
        return OpenAIDecoder(config.id, request.model)


# --- response ---------------------------------------------------------------


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def stream_error(provider_id: str, doc: dict[str, Any]) -> ProviderError:
    """An in-stream `{"error": {...}}` chunk: the HTTP status it carries, else 502."""
    err = doc.get("error")
    if isinstance(err, dict):
        message = str(err.get("message") or json.dumps(err)[:500])
        code = err.get("code", err.get("status"))
    elif isinstance(err, str):
        message, code = err, doc.get("code")
    else:  # the unwrapped {"object": "error", "message", "code"} of older vLLM
        message, code = str(doc.get("message") or json.dumps(doc)[:500]), doc.get("code")
    if isinstance(code, str) and code.isdigit():
        code = int(code)
    status = code if isinstance(code, int) and 400 <= code <= 599 else 502
    return ProviderError(provider_id, status, message)


def thinking_blocks(reasoning: list[str]) -> tuple[dict[str, Any], ...]:
    """The turn's reasoning as one unsigned block (unsigned: Anthropic will not replay it)."""
    text = "".join(reasoning)
    return ({"type": "thinking", "thinking": text, "signature": ""},) if text else ()


class OpenAIDecoder(Decoder):
    def __init__(self, provider_id: str, model: str) -> None:
        self.provider_id = provider_id
        self.model = model
        self.finish_reason = ""
        self.done = False
        self.refused = False
        self.calls: dict[int, _PartialCall] = {}
        self.reasoning: list[str] = []
        self.usage = Usage(model=model, provider=provider_id)

    def feed(self, frame: Frame) -> list[ProviderEvent]:
        data = frame.data.strip()
        if self.done or not data:
            return []
        if data == "[DONE]":
            self.done = True
            return []
        doc = parse_json(self.provider_id, data)
        if not isinstance(doc, dict):
            raise ProviderError(self.provider_id, 502, f"malformed stream frame: {data[:200]!r}")
        if frame.event == "error" or doc.get("error") is not None or doc.get("object") == "error":
            raise stream_error(self.provider_id, doc)
        if isinstance(doc.get("model"), str) and doc["model"]:
            self.model = doc["model"]
        if isinstance(doc.get("usage"), dict):
            self._usage(doc["usage"])
        events: list[ProviderEvent] = []
        for choice in doc.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue  # we never ask for n > 1
            events.extend(self._delta(choice.get("delta") or {}))
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])
        return events

    def _delta(self, delta: dict[str, Any]) -> list[ProviderEvent]:
        events: list[ProviderEvent] = []
        # DeepSeek and vLLM say reasoning_content, OpenRouter and newer vLLM say reasoning;
        # a server that sends both sends the same text twice, so take one.
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning.append(reasoning)
            events.append(ThinkingDelta(reasoning))
        if isinstance(delta.get("content"), str) and delta["content"]:
            events.append(TextDelta(delta["content"]))
        if isinstance(delta.get("refusal"), str) and delta["refusal"]:
            self.refused = True
            events.append(TextDelta(delta["refusal"]))
        for fragment in delta.get("tool_calls") or []:
            self._tool_fragment(fragment)
        return events

    def _tool_fragment(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        if not isinstance(index, int):  # servers that send whole calls without an index
            known = [i for i, c in self.calls.items() if fragment.get("id") and c.id == fragment["id"]]
            index = known[0] if known else len(self.calls)
        call = self.calls.setdefault(index, _PartialCall())
        call.id = fragment.get("id") or call.id
        function = fragment.get("function") or {}
        call.name = function.get("name") or call.name
        if isinstance(function.get("arguments"), str):
            call.arguments.append(function["arguments"])

    def _usage(self, raw: dict[str, Any]) -> None:
        details = raw.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or raw.get("prompt_cache_hit_tokens") or 0)  # DeepSeek's name
        # Usage counts the Anthropic way (apps.gateway.pricing): input_tokens
        # excludes the cached prompt tokens, which are priced as cache reads.
        self.usage = Usage(
            input_tokens=max(0, int(raw.get("prompt_tokens") or 0) - cached),
            output_tokens=int(raw.get("completion_tokens") or 0),
            cache_read_input_tokens=int(cached),
            model=self.model,
            provider=self.provider_id,
        )

    def _tool_call(self, call: _PartialCall) -> ToolCall:
        raw = "".join(call.arguments).strip()
        try:
            arguments = json.loads(raw) if raw else {}
        except ValueError as exc:
            raise ProviderError(
                self.provider_id, 502, f"tool call {call.name!r} has malformed arguments: {raw[:200]!r}"
            ) from exc
        if not isinstance(arguments, dict):
            raise ProviderError(
                self.provider_id, 502, f"tool call {call.name!r} arguments are not an object: {raw[:200]!r}"
            )
        if not call.name:
            raise ProviderError(self.provider_id, 502, "tool call without a function name")
        return ToolCall(id=call.id or f"call_{secrets.token_hex(8)}", name=call.name, input=arguments)

    def finish(self) -> list[ProviderEvent]:
        if not self.done and not self.finish_reason:
            raise ProviderError(self.provider_id, 0, "stream ended before the provider finished the reply")
        calls = [self._tool_call(c) for _, c in sorted(self.calls.items())]
        stop = FINISH_REASONS.get(self.finish_reason, "end_turn")
        if calls and stop == "end_turn":
            stop = "tool_use"  # some compatible servers report "stop" after tool calls
        if self.refused and stop == "end_turn":
            stop = "refusal"
        usage = replace(self.usage, model=self.model)
        thinking = (
            ({"type": "thinking", "thinking": "".join(self.reasoning), "signature": ""},) if self.reasoning else ()
        )
        return [*calls, Done(stop_reason=stop, usage=usage, thinking=thinking)]
