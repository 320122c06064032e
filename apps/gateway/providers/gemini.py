"""Gemini `streamGenerateContent` (SSE) as a `WireProtocol` (SPEC 7.2).

Request: POST `{base_url}/models/{model}:streamGenerateContent?alt=sse`
(base_url ends in `/v1beta`), key in `x-goog-api-key`. System blocks become
`systemInstruction`; assistant turns are role `model`; `tool_use` becomes a
`functionCall` part and `tool_result` a `functionResponse` part named after
the matching `tool_use` (Gemini correlates by name, not id); tool schemas are
cut down to the OpenAPI subset `functionDeclarations` accept.

Effort: Gemini 2.5 models get `thinkingBudget` low=0 (128 on Pro, which
cannot turn thinking off), medium=2048, high=8192, capped at half of
`max_tokens` (thinking counts against `maxOutputTokens`); Gemini 3 and later
get `thinkingLevel` low | medium (Flash) | high. Other models get none.

Response: every SSE `data:` is a GenerateContentResponse. Gemini issues no
call ids, so tool calls get `lc-gem-<n>-<hex>`. Thought signatures (which
Gemini 3 requires back on function calls) are returned in `Done.thinking`
as `{"type": "thinking", "thinking", "signature", "tool_use_id"?}` and put
back on the same parts when those blocks are replayed.
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

# Keys Gemini's Schema object accepts; anything else ($schema, additionalProperties, $ref, const, ...) is cut.
SCHEMA_KEYS = frozenset(
    {
        "type", "format", "title", "description", "nullable", "enum", "items", "properties", "required",
        "minItems", "maxItems", "minProperties", "maxProperties", "minLength", "maxLength", "pattern",
        "minimum", "maximum", "default", "example", "anyOf", "propertyOrdering",
    }
)  # fmt: skip
# `format` values Gemini accepts, per type (others are a 400).
FORMATS = {"string": {"enum", "date-time"}, "integer": {"int32", "int64"}, "number": {"float", "double"}}
SAMPLING = {
    "temperature": "temperature",
    "top_p": "topP",
    "top_k": "topK",
    "seed": "seed",
    "frequency_penalty": "frequencyPenalty",
    "presence_penalty": "presencePenalty",
}
BUDGETS = {"low": 0, "medium": 2048, "high": 8192}
REFUSALS = frozenset({"SAFETY", "RECITATION", "LANGUAGE", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "IMAGE_SAFETY"})
MALFORMED_CALLS = frozenset({"MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL"})
TOOL_ID_PREFIX = "lc-gem-"


# --- tool schemas --------------------------------------------------------------------


def gemini_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """A JSON Schema as Gemini's `parameters`, or None when there is nothing to declare."""
    defs: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        for name, sub in (schema.get(key) or {}).items():
            defs[f"#/{key}/{name}"] = sub
    out = _schema_node(schema, defs, frozenset())
    if out.get("type", "object") == "object" and not out.get("properties"):
        return None  # Gemini rejects an OBJECT with empty properties; a no-argument tool omits parameters
    return out


def _schema_node(node: Any, defs: dict[str, Any], seen: frozenset[str]) -> dict[str, Any]:
    if not isinstance(node, dict):
        return {}
    ref = node.get("$ref")
    if isinstance(ref, str):
        if ref in seen or ref not in defs:
            return {"type": "object"}  # a cycle or an unresolvable ref: the model sees an opaque object
        return _schema_node(defs[ref], defs, seen | {ref})
    node = dict(node)
    for sub in node.pop("allOf", None) or []:  # Gemini has no allOf: merge the parts into the node
        for key, value in _schema_node(sub, defs, seen).items():
            if key == "properties":
                node["properties"] = {**value, **(node.get("properties") or {})}
            elif key == "required":
                node["required"] = sorted({*value, *(node.get("required") or [])})
            else:
                node.setdefault(key, value)
    if "oneOf" in node:
        node.setdefault("anyOf", node.pop("oneOf"))
    if "const" in node:
        node.setdefault("enum", [node.pop("const")])
    kind = node.get("type")
    if isinstance(kind, list):  # ["string", "null"] -> string + nullable
        rest = [t for t in kind if t != "null"]
        node["nullable"] = len(rest) < len(kind) or bool(node.get("nullable"))
        kind = node["type"] = rest[0] if rest else "string"
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key not in SCHEMA_KEYS:
            continue
        if key == "properties" and isinstance(value, dict):
            props = {name: _schema_node(sub, defs, seen) for name, sub in value.items()}
            if props:
                out[key] = props
        elif key == "items":
            out[key] = _schema_node(value, defs, seen)
        elif key == "anyOf" and isinstance(value, list):
            out[key] = [_schema_node(sub, defs, seen) for sub in value]
        elif key == "enum":
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                out[key] = value  # Gemini enums are string-only
        elif key == "format":
            if value in FORMATS.get(str(kind), set()):
                out[key] = value
        else:
            out[key] = value
    if "required" in out:
        names = out.get("properties") or {}
        out["required"] = [r for r in out["required"] if r in names]
        if not out["required"]:
            del out["required"]
    return out


# --- request ---------------------------------------------------------------------------


def thinking_config(model: str, effort: str, max_tokens: int) -> dict[str, Any] | None:
    if effort not in BUDGETS or not model.startswith("gemini-") or model.startswith(("gemini-1", "gemini-2.0")):
        return None
    if model.startswith("gemini-2"):
        budget = BUDGETS[effort]
        if max_tokens > 0:
            budget = min(budget, max_tokens // 2)
        if "pro" in model:
            budget = max(budget, 128)  # 2.5 Pro cannot disable thinking (its minimum budget)
        return {"thinkingBudget": budget, "includeThoughts": budget > 0}
    level = effort if effort != "medium" or "flash" in model else "high"  # Pro has low|high only
    return {"thinkingLevel": level, "includeThoughts": True}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")
    return json.dumps(content)


def _part(provider_id: str, block: dict[str, Any], names: dict[str, str]) -> dict[str, Any] | None:
    kind = block.get("type")
    if kind == "text":
        return {"text": block["text"]} if block.get("text") else None
    if kind == "tool_use":
        return {"functionCall": {"name": block["name"], "args": block.get("input") or {}}}
    if kind == "tool_result":
        name = names.get(str(block.get("tool_use_id")))
        if name is None:
            raise ProviderError(provider_id, 400, f"tool_result {block.get('tool_use_id')!r} has no earlier tool_use")
        key = "error" if block.get("is_error") else "output"
        return {"functionResponse": {"name": name, "response": {key: _text_of(block.get("content", ""))}}}
    if kind == "image":
        return {"inlineData": {"mimeType": block["media_type"], "data": block["data"]}}
    raise ProviderError(provider_id, 400, f"content block type {kind!r} is not supported by the gemini driver")


def _attach_signatures(parts: list[dict[str, Any]], ids: list[str | None], thinking: list[dict[str, Any]]) -> None:
    """Put the thought signatures of a replayed model turn back on the parts they came with."""
    by_call = {b["tool_use_id"]: b["signature"] for b in thinking if b.get("signature") and b.get("tool_use_id")}
    loose = [b["signature"] for b in thinking if b.get("signature") and not b.get("tool_use_id")]
    for part, call_id in zip(parts, ids, strict=True):
        if call_id is not None and call_id in by_call:
            part["thoughtSignature"] = by_call[call_id]
    if loose and parts:
        calls = [p for p in parts if "functionCall" in p and "thoughtSignature" not in p]
        # The first call of a step carries it when there are calls; otherwise the last part does.
        (calls[0] if calls else parts[-1]).setdefault("thoughtSignature", loose[0])


def _contents(provider_id: str, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    names: dict[str, str] = {}
    contents: list[dict[str, Any]] = []
    for message in messages:
        blocks = message.get("content")
        if isinstance(blocks, str):
            blocks = [{"type": "text", "text": blocks}]
        parts: list[dict[str, Any]] = []
        ids: list[str | None] = []
        thinking: list[dict[str, Any]] = []
        for block in blocks or []:
            if block.get("type") in ("thinking", "redacted_thinking"):
                thinking.append(block)  # Gemini takes back signatures only, never the thought text
                continue
            if block.get("type") == "tool_use":
                names[str(block["id"])] = str(block["name"])
            part = _part(provider_id, block, names)
            if part is not None:
                parts.append(part)
                ids.append(str(block["id"]) if block.get("type") == "tool_use" else None)
        if not parts:
            continue
        role = "model" if message.get("role") == "assistant" else "user"
        if role == "model":
            _attach_signatures(parts, ids, thinking)
        contents.append({"role": role, "parts": parts})
    return contents


def _generation_config(request: ProviderRequest, model: str) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if request.max_tokens > 0:
        config["maxOutputTokens"] = request.max_tokens
    for ours, theirs in SAMPLING.items():
        if request.sampling.get(ours) is not None:
            config[theirs] = request.sampling[ours]
    stop = request.sampling.get("stop")
    if stop:
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    thinking = thinking_config(model, request.effort, request.max_tokens)
    if thinking is not None:
        config["thinkingConfig"] = thinking
    return config


class GeminiProtocol(WireProtocol):
    framing: ClassVar[str] = "sse"
    sampling_knobs: ClassVar[frozenset[str]] = frozenset({*SAMPLING, "stop"})
    capabilities: ClassVar[Capabilities] = Capabilities(
        streaming=True,
        parallel_tools=True,
        vision=True,
        thinking=True,
        max_context_tokens=1_048_576,
        native_prompt_cache=False,  # Gemini caches implicitly; reads show up as cache_read_input_tokens
        effort=True,
    )

    def build(self, config: ProviderConfig, request: ProviderRequest) -> HttpCall:
        model = request.model.removeprefix("models/")
        body: dict[str, Any] = {"contents": _contents(config.id, request.messages)}
        system = [{"text": text} for text in request.system if text]
        if system:
            body["systemInstruction"] = {"parts": system}
        declarations = []
        for tool in request.tools:
            declaration: dict[str, Any] = {"name": tool.name, "description": tool.description}
            parameters = gemini_schema(tool.input_schema)
            if parameters is not None:
                declaration["parameters"] = parameters
            declarations.append(declaration)
        if declarations:
            body["tools"] = [{"functionDeclarations": declarations}]
        generation = _generation_config(request, model)
        if generation:
            body["generationConfig"] = generation
        headers = {"accept": "text/event-stream"}
        if config.api_key:
            headers["x-goog-api-key"] = config.api_key
        url = f"{config.base_url}/models/{model}:streamGenerateContent?alt=sse"
        return HttpCall(url=url, headers=headers, body=body)

    def decoder(self, config: ProviderConfig, request: ProviderRequest) -> Decoder:
        return GeminiDecoder(config.id, request.model)

    def error_message(self, body: bytes) -> str:
        """`{"error": {"code", "message", "status", "details"}}` -> "STATUS: message (retry in 12s)"."""
        try:
            doc = json.loads(body)
        except ValueError:
            return super().error_message(body)
        if isinstance(doc, list) and doc:  # the non-SSE endpoint wraps errors in an array
            doc = doc[0]
        err = doc.get("error") if isinstance(doc, dict) else None
        if not isinstance(err, dict) or not err.get("message"):
            return super().error_message(body)
        return _error_text(err)


def _error_text(err: dict[str, Any]) -> str:
    text = f"{err['status']}: {err['message']}" if err.get("status") else str(err["message"])
    for detail in err.get("details") or []:
        if isinstance(detail, dict) and detail.get("retryDelay"):
            text += f" (retry in {detail['retryDelay']})"  # google.rpc.RetryInfo: Gemini sends no Retry-After
    return text


# --- response --------------------------------------------------------------------------


class GeminiDecoder(Decoder):
    def __init__(self, provider_id: str, model: str) -> None:
        self.provider_id = provider_id
        self.model = model
        self.finish_reason = ""
        self.block_reason = ""
        self.calls = 0
        self.usage: dict[str, Any] = {}
        self.thoughts: list[str] = []
        self.signatures: list[dict[str, Any]] = []

    def feed(self, frame: Frame) -> list[ProviderEvent]:
        if not frame.data.strip():
            return []
        doc = parse_json(self.provider_id, frame.data)
        if not isinstance(doc, dict):
            raise ProviderError(self.provider_id, 502, f"malformed stream frame: {frame.data[:200]!r}")
        err = doc.get("error")
        if isinstance(err, dict):  # an error after the 200 (overload mid-stream)
            code = err.get("code")
            status = code if isinstance(code, int) and code >= 400 else 500
            raise ProviderError(self.provider_id, status, _error_text({"message": "stream error", **err}))
        if isinstance(doc.get("usageMetadata"), dict):
            self.usage = doc["usageMetadata"]  # cumulative: the last one wins
        if doc.get("modelVersion"):
            self.model = str(doc["modelVersion"])
        feedback = doc.get("promptFeedback")
        if isinstance(feedback, dict) and feedback.get("blockReason"):
            self.block_reason = str(feedback["blockReason"])
        events: list[ProviderEvent] = []
        candidates = doc.get("candidates") or []
        if candidates and isinstance(candidates[0], dict):
            candidate = candidates[0]
            for part in (candidate.get("content") or {}).get("parts") or []:
                events.extend(self._part(part))
            if candidate.get("finishReason"):
                self.finish_reason = str(candidate["finishReason"])
        return events

    def _part(self, part: dict[str, Any]) -> list[ProviderEvent]:
        signature = str(part.get("thoughtSignature") or "")
        call = part.get("functionCall")
        if isinstance(call, dict):
            args = call.get("args") or {}
            if not isinstance(args, dict) or not call.get("name"):
                raise ProviderError(self.provider_id, 502, f"malformed functionCall: {json.dumps(call)[:200]}")
            self.calls += 1
            call_id = str(call.get("id") or f"{TOOL_ID_PREFIX}{self.calls}-{secrets.token_hex(4)}")
            if signature:
                self.signatures.append(
                    {"type": "thinking", "thinking": "", "signature": signature, "tool_use_id": call_id}
                )
            return [ToolCall(id=call_id, name=str(call["name"]), input=args)]
        if signature:
            self.signatures.append({"type": "thinking", "thinking": "", "signature": signature})
        text = part.get("text")
        if not isinstance(text, str) or not text:
            return []
        if part.get("thought"):
            self.thoughts.append(text)
            return [ThinkingDelta(text)]
        return [TextDelta(text)]

    def finish(self) -> list[ProviderEvent]:
        reason = self.finish_reason
        if not reason and not self.block_reason:
            raise ProviderError(self.provider_id, 0, "stream ended without a finishReason")
        if reason in MALFORMED_CALLS:
            raise ProviderError(self.provider_id, 502, f"the model produced an invalid function call ({reason})")
        if not reason or reason in REFUSALS:
            stop = "refusal"  # a blocked prompt (promptFeedback.blockReason) or a blocked answer
        elif reason == "MAX_TOKENS":
            stop = "max_tokens"
        else:
            stop = "tool_use" if self.calls else "end_turn"
        return [Done(stop_reason=stop, usage=self._usage(), thinking=self._thinking())]

    def _usage(self) -> Usage:
        u = self.usage
        cached = int(u.get("cachedContentTokenCount") or 0)
        prompt = int(u.get("promptTokenCount") or 0) + int(u.get("toolUsePromptTokenCount") or 0)
        return Usage(
            input_tokens=max(0, prompt - cached),  # Anthropic's meaning: cache reads counted apart
            output_tokens=int(u.get("candidatesTokenCount") or 0) + int(u.get("thoughtsTokenCount") or 0),
            cache_read_input_tokens=cached,
            model=self.model,
            provider=self.provider_id,
        )

    def _thinking(self) -> tuple[dict[str, Any], ...]:
        blocks = [dict(b) for b in self.signatures]
        if self.thoughts:
            if not blocks:
                blocks.append({"type": "thinking", "thinking": "", "signature": ""})
            blocks[0]["thinking"] = "".join(self.thoughts)
        return tuple(blocks)
