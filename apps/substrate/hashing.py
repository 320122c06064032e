"""Content hash of an AgentDef, following loomcycle's recipe (SPEC 5.3):
hash-significant fields only, alphabetical keys, empty values omitted,
text normalised (CRLF -> LF, trailing whitespace trimmed), compact JSON with
Go's HTML escaping and float formatting, then "sha256:" + hex.

Go marshals a map with sorted keys but a struct in field-declaration order;
loomcycle's nested structs (`sampling`, `compaction`, `models` candidates) are
not declared alphabetically, so those are emitted in their Go order
(`_STRUCTS`), with fields the Go struct does not have dropped as Go's
unmarshal drops them."""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal
from typing import Any

AGENT_HASH_FIELDS = frozenset(
    {
        "channels",
        "code_body",
        "compaction",
        "core_blocks",
        "description",
        "effort",
        "evaluation_scopes",
        "history_scope",
        "inherit_core_blocks",
        "inject_tool_guide",
        "internal",
        "interruption",
        "max_concurrent_children",
        "max_iterations",
        "max_tokens",
        "memory_backend",
        "memory_consolidation",
        "memory_index_max_bytes",
        "memory_inject_max_tokens",
        "memory_protocol",
        "memory_quota_bytes",
        "memory_roots",
        "memory_scopes",
        "model",
        "models",
        "name",
        "provider",
        "providers",
        "search_providers",
        "sampling",
        "sql_quota_bytes",
        "sql_scopes",
        "system_prompt",
        "tier",
        "tools",
        "unbounded_iterations",
    }
)
_NORMALISED_TEXT = frozenset({"system_prompt"})


def _is_empty(value: Any) -> bool:
    if value is None or value is False or value == "" or value == 0:
        return True
    if isinstance(value, (list, dict)) and not value:
        return True
    if isinstance(value, dict):
        return all(_is_empty(v) for v in value.values())
    return False


def _prune(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _prune(v) for k, v in sorted(value.items()) if not _is_empty(v)}
    if isinstance(value, list):
        return [_prune(v) for v in value]
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        return int(value)  # Go's encoding/json writes 1.0 as 1
    return value


def normalise_text(text: str) -> str:
    return text.replace("\r\n", "\n").rstrip(" \t\n\r")


class GoStruct(dict[str, Any]):
    """A JSON object Go emits in declaration (insertion) order, not sorted."""


def go_float(value: float) -> str:
    """Go's encoding/json float64 text: shortest digits, positional between
    1e-6 and 1e21, else exponent form with a one-digit `e-7` kept short."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"json: unsupported value: {value!r}")
    magnitude = abs(value)
    if magnitude != 0 and (magnitude < 1e-6 or magnitude >= 1e21):
        out = repr(value)  # Python's shortest repr is exponent form here, e.g. 1e-07
        if len(out) >= 4 and out[-4] == "e" and out[-3] == "-" and out[-2] == "0":
            out = out[:-2] + out[-1]
        return out
    return format(Decimal(repr(value)).normalize(), "f")


def _go_string(text: str) -> str:
    return (
        json.dumps(text, ensure_ascii=False)
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def _go_encode(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(_go_string(value))
    elif value is None or isinstance(value, bool):
        out.append("null" if value is None else "true" if value else "false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(go_float(value))
    elif isinstance(value, dict):
        items = value.items() if isinstance(value, GoStruct) else sorted(value.items())
        out.append("{")
        for i, (key, item) in enumerate(items):
            out.append(("," if i else "") + _go_string(str(key)) + ":")
            _go_encode(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _go_encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"json: unsupported type: {type(value).__name__}")


def go_json(value: Any) -> str:
    """Compact JSON as Go's encoding/json writes it by default: map keys
    sorted (`GoStruct` objects keep their order), `<>&` and U+2028/2029
    escaped, floats in Go's format."""
    out: list[str] = []
    _go_encode(value, out)
    return "".join(out)


# Go struct field order of loomcycle's nested agent types (internal/agents).
_STRUCTS: dict[str, tuple[str, ...]] = {
    "channels": ("publish", "subscribe"),
    "compaction": (
        "enabled",
        "target_percentage",
        "keep_last_n",
        "keep_first",
        "autocompact_at_pct",
        "model",
        "memory_flush",
    ),
    "interruption": ("enabled", "kinds", "max_pending"),
    "sampling": ("temperature", "top_p", "top_k", "frequency_penalty", "presence_penalty", "seed", "stop"),
}
_TIER_CANDIDATE = ("provider", "model")  # json tags without omitempty: both always emitted


def _as_struct(value: Any, order: tuple[str, ...], *, keep_empty: bool = False) -> Any:
    if not isinstance(value, dict):
        return value
    return GoStruct((k, value.get(k, "")) for k in order if keep_empty or k in value)


def _agent_structs(content: dict[str, Any]) -> dict[str, Any]:
    """`content` is already pruned; a struct left empty by dropped fields is omitted."""
    out = dict(content)
    for key, order in _STRUCTS.items():
        if key in out:
            out[key] = _as_struct(out[key], order)
            if out[key] == {}:
                del out[key]
    models = out.get("models")
    if isinstance(models, dict):
        out["models"] = {
            tier: [_as_struct(c, _TIER_CANDIDATE, keep_empty=True) for c in cands] if isinstance(cands, list) else cands
            for tier, cands in models.items()
        }
    return out


def content_sha256(
    name: str,
    definition: dict[str, Any],
    fields: frozenset[str],
    text: frozenset[str],
    *,
    structs: bool = False,
) -> str:
    """The recipe, for any kind: `fields` are hash-significant, `text` get
    normalised; `structs` applies the agent's nested Go struct order."""
    content: dict[str, Any] = {"name": name}
    for key, value in definition.items():
        if key not in fields or key == "name":
            continue
        if key in text and isinstance(value, str):
            value = normalise_text(value)
        content[key] = value
    pruned = _prune(content)
    if structs:
        pruned = _agent_structs(pruned)
    return "sha256:" + hashlib.sha256(go_json(pruned).encode()).hexdigest()


def agent_content_sha256(name: str, definition: dict[str, Any]) -> str:
    return content_sha256(name, definition, AGENT_HASH_FIELDS, _NORMALISED_TEXT, structs=True)


SKILL_HASH_FIELDS = frozenset({"name", "description", "tools", "body"})
MCP_HASH_FIELDS = frozenset({"name", "description", "transport", "url", "headers"})


def skill_content_sha256(name: str, definition: dict[str, Any]) -> str:
    return content_sha256(name, definition, SKILL_HASH_FIELDS, frozenset({"body"}))


def mcp_content_sha256(name: str, definition: dict[str, Any]) -> str:
    return content_sha256(name, definition, MCP_HASH_FIELDS, frozenset({"description"}))
