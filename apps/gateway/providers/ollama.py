"""The Ollama `/api/chat` driver (SPEC 7.2): `ollama` (Ollama cloud, bearer
key) and `ollama-local` (no key), over the shared HTTP transport.

`build` turns a neutral `ProviderRequest` into `POST {base_url}/api/chat`
with `stream: true`; `OllamaDecoder` turns the NDJSON lines back into
neutral events. Wire rules this module encodes (Ollama API docs, docs/api.md
"Generate a chat completion"):

- all system blocks become ONE leading `system` message; an assistant turn is
  one message with its text and `tool_calls` whose `arguments` is an object;
- each `tool_result` becomes a `tool` message with `tool_name` (Ollama matches
  results by name, not id), placed before any user text of the same turn; an
  error result is prefixed with "ERROR: "; images go in the user message's
  `images` list as bare base64; thinking blocks are dropped;
- sampling goes in `options` (`num_predict` = max_tokens); effort medium/high
  -> `think: true`, low -> `think: false` (a model that cannot think refuses
  `think: true` with a 400); config `options.num_ctx` and
  `options.keep_alive` pass through (Ollama's default context is small);
- lines carry `message.content`, `message.thinking` and whole `tool_calls`
  (no fragments); Ollama issues no tool ids, so each call gets a fresh
  `lc-<hex>` id; the last line has `done: true`, `done_reason` and the token
  counts; an `{"error": "..."}` line is a 502.
"""

from __future__ import annotations

import json
import secrets
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
from apps.gateway.providers.openai import openai_tools, result_text, thinking_blocks

OPTION_KEYS = ("temperature", "top_p", "top_k", "seed", "frequency_penalty", "presence_penalty")
THINK = {"medium": True, "high": True, "low": False}  # "": the model's default


def new_tool_id() -> str:
    return f"lc-{secrets.token_hex(8)}"


# --- request ----------------------------------------------------------------


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return list(content or [])


def _assistant(provider_id: str, blocks: list[dict[str, Any]], names: dict[str, str]) -> dict[str, Any]:
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "tool_use":
            names[block["id"]] = block["name"]
            calls.append({"function": {"name": block["name"], "arguments": block.get("input") or {}}})
        elif kind not in ("thinking", "redacted_thinking"):
            raise ProviderError(provider_id, 400, f"unsupported content block {kind!r} in an assistant message")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if calls:
        message["tool_calls"] = calls
    return message


def _user(provider_id: str, blocks: list[dict[str, Any]], names: dict[str, str]) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    text: list[str] = []
    images: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "tool_result":
            tool: dict[str, Any] = {"role": "tool", "content": result_text(block)}
            name = names.get(str(block.get("tool_use_id", "")))
            if name:
                tool["tool_name"] = name
            tools.append(tool)
        elif kind == "text":
            if block.get("text"):
                text.append(str(block["text"]))
        elif kind == "image":
            images.append(str(block["data"]))
        else:
            raise ProviderError(provider_id, 400, f"unsupported content block {kind!r} in a user message")
    if not text and not images:
        return tools
    user: dict[str, Any] = {"role": "user", "content": "\n\n".join(text)}
    if images:
        user["images"] = images
    return [*tools, user]


def ollama_messages(config: ProviderConfig, request: ProviderRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = "\n\n".join(s for s in request.system if s)
    if system:
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}  # tool_use id -> tool name, for the tool messages
    for message in request.messages:
        if message["role"] == "assistant":
            out.append(_assistant(config.id, _blocks(message), names))
        else:
            out.extend(_user(config.id, _blocks(message), names))
    return out


def _options(config: ProviderConfig, request: ProviderRequest) -> dict[str, Any]:
    options = {k: request.sampling[k] for k in OPTION_KEYS if request.sampling.get(k) is not None}
    stop = request.sampling.get("stop")
    if stop:
        options["stop"] = [stop] if isinstance(stop, str) else list(stop)
    if request.max_tokens > 0:
        options["num_predict"] = request.max_tokens
    if config.options.get("num_ctx"):
        options["num_ctx"] = int(config.options["num_ctx"])
    return options


class OllamaProtocol(WireProtocol):
    framing: ClassVar[str] = "ndjson"
    sampling_knobs: ClassVar[frozenset[str]] = frozenset({*OPTION_KEYS, "stop"})
    # Per model in truth (vision: llava, gemma3...); a yaml `capabilities:` block widens it.
    capabilities: ClassVar[Capabilities] = Capabilities(
        streaming=True, parallel_tools=True, vision=False, thinking=True, effort=True
    )

    def build(self, config: ProviderConfig, request: ProviderRequest) -> HttpCall:
        body: dict[str, Any] = {"model": request.model, "messages": ollama_messages(config, request), "stream": True}
        if request.tools:
            body["tools"] = openai_tools(request)
        options = _options(config, request)
        if options:
            body["options"] = options
        if request.effort in THINK:
            body["think"] = THINK[request.effort]
        if config.options.get("keep_alive") is not None:
            body["keep_alive"] = config.options["keep_alive"]
        headers = {"Accept": "application/x-ndjson"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        return HttpCall(url=f"{config.base_url}/api/chat", headers=headers, body=body)

    def decoder(self, config: ProviderConfig, request: ProviderRequest) -> Decoder:
        return OllamaDecoder(config.id, request.model)

    def error_message(self, body: bytes) -> str:
        """Ollama answers errors as `{"error": "message"}`."""
        try:
            doc = json.loads(body)
        except ValueError:
            return super().error_message(body)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str) and doc["error"]:
            return str(doc["error"])
        return super().error_message(body)


# --- response ---------------------------------------------------------------


class OllamaDecoder(Decoder):
    def __init__(self, provider_id: str, model: str) -> None:
        self.provider_id = provider_id
        self.model = model
        self.done = False
        self.done_reason = ""
        self.saw_tool_calls = False
        self.reasoning: list[str] = []
        self.usage = Usage(model=model, provider=provider_id)

    def feed(self, frame: Frame) -> list[ProviderEvent]:
        doc = parse_json(self.provider_id, frame.data)
        if not isinstance(doc, dict):
            raise ProviderError(self.provider_id, 502, f"malformed stream frame: {frame.data[:200]!r}")
        if doc.get("error") is not None:
            raise ProviderError(self.provider_id, 502, str(doc["error"]))
        if self.done:
            return []
        if isinstance(doc.get("model"), str) and doc["model"]:
            self.model = doc["model"]
        events = self._message(doc.get("message") or {})
        if doc.get("done"):
            self.done = True
            self.done_reason = str(doc.get("done_reason") or "")
            self.usage = Usage(
                input_tokens=int(doc.get("prompt_eval_count") or 0),
                output_tokens=int(doc.get("eval_count") or 0),
                model=self.model,
                provider=self.provider_id,
            )
        return events

    def _message(self, message: dict[str, Any]) -> list[ProviderEvent]:
        events: list[ProviderEvent] = []
        if isinstance(message.get("thinking"), str) and message["thinking"]:
            self.reasoning.append(message["thinking"])
            events.append(ThinkingDelta(message["thinking"]))
        if isinstance(message.get("content"), str) and message["content"]:
            events.append(TextDelta(message["content"]))
        for call in message.get("tool_calls") or []:
            events.append(self._tool_call(call))
        return events

    def _tool_call(self, call: dict[str, Any]) -> ToolCall:
        function = call.get("function") or {}
        name, arguments = function.get("name"), function.get("arguments")
        if isinstance(arguments, str):  # some gateways in front of Ollama send OpenAI-style strings
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                raise ProviderError(self.provider_id, 502, f"tool call {name!r} has malformed arguments") from exc
        arguments = {} if arguments is None else arguments
        if not name or not isinstance(arguments, dict):
            raise ProviderError(self.provider_id, 502, f"malformed tool call: {json.dumps(call)[:200]}")
        self.saw_tool_calls = True
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else new_tool_id()
        return ToolCall(id=str(call_id), name=str(name), input=arguments)

    def finish(self) -> list[ProviderEvent]:
        if not self.done:
            raise ProviderError(self.provider_id, 0, "stream ended before the provider sent done")
        if self.saw_tool_calls:
            stop = "tool_use"
        else:
            stop = "max_tokens" if self.done_reason == "length" else "end_turn"
        return [Done(stop_reason=stop, usage=self.usage, thinking=thinking_blocks(self.reasoning))]
