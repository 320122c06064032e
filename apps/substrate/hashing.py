"""Content hashes of agent, skill and MCP server definitions, byte-identical
to loomcycle's (SPEC 5.3): the hash-significant fields decoded as Go decodes
them into its content struct, marshalled as Go's encoding/json writes that
struct, then "sha256:" + hex.

What Go's types decide, and `_Spec` reproduces:

- a struct is written in field-declaration order, a map with sorted keys;
- a plain field tagged `omitempty` is left out at its zero value (`0`,
  `false`, `""`, empty list or map, absent or null);
- a pointer field (`*float64`, `*int`, `*bool`, `*string`) is left out only
  when absent or null, so `temperature: 0` or `enabled: false` is kept;
- a field without `omitempty` is always written (absent: its zero value);
- a pointer-to-struct block (`sampling`, `compaction`, `channels`,
  `interruption`) is dropped when nothing inside it would be written;
- a map keeps every entry, even an empty one;
- keys the Go struct does not have are dropped, as Go's decoder drops them.

Text fields (`system_prompt`, skill `body`, MCP `description`) have CRLF
turned into LF and trailing whitespace trimmed before the zero check."""

from __future__ import annotations

import hashlib
import json
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from decimal import Decimal
from typing import Any


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


# --- Go field kinds ---------------------------------------------------------------

_ABSENT = object()


def _is_go_zero(value: Any) -> bool:
    if value is None or value is False or value == "":
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value == 0
    return isinstance(value, (list, tuple, dict)) and not value


class _Spec(ABC):
    """How one Go field is written; each kind of Go field is a subclass."""

    @abstractmethod
    def encode(self, value: Any) -> Any:
        """`value` as Go writes this field, or `_ABSENT` when Go leaves it out.
        `value` is `_ABSENT` when the key is missing."""


@dataclass(frozen=True)
class _Value(_Spec):
    """A string, number or bool field; `omitempty` unless told otherwise."""

    omitempty: bool = True
    zero: Any = ""  # written for an absent value when not omitempty
    text: bool = False

    def encode(self, value: Any) -> Any:
        if value is _ABSENT or value is None:
            value = self.zero
        if self.text and isinstance(value, str):
            value = normalise_text(value)
        return _ABSENT if self.omitempty and _is_go_zero(value) else value


@dataclass(frozen=True)
class _Pointer(_Spec):
    """`*T` with `omitempty`: only nil (absent or null) is left out."""

    def encode(self, value: Any) -> Any:
        return _ABSENT if value is _ABSENT or value is None else value


@dataclass(frozen=True)
class _Slice(_Spec):
    elem: _Spec
    omitempty: bool = True  # False inside a map, where Go writes `[]` and `null`

    def encode(self, value: Any) -> Any:
        if value is _ABSENT:
            value = None
        if self.omitempty and _is_go_zero(value):
            return _ABSENT
        if not isinstance(value, list):
            return value  # not a list: Go would refuse it; hash what was given
        return [_or_zero(self.elem, item) for item in value]


@dataclass(frozen=True)
class _Map(_Spec):
    elem: _Spec

    def encode(self, value: Any) -> Any:
        if value is _ABSENT or _is_go_zero(value):
            return _ABSENT
        if not isinstance(value, dict):
            return value
        return {str(k): _or_zero(self.elem, v) for k, v in value.items()}


@dataclass(frozen=True)
class _Struct(_Spec):
    fields: tuple[tuple[str, _Spec], ...]
    pointer: bool = True  # *Struct,omitempty, collapsed to nil when empty

    def encode(self, value: Any) -> Any:
        if value is _ABSENT or value is None:
            value = {}
        if not isinstance(value, dict):
            return _ABSENT if _is_go_zero(value) else value
        out = GoStruct()
        for key, spec in self.fields:
            item = spec.encode(value.get(key, _ABSENT))
            if item is not _ABSENT:
                out[key] = item
        return _ABSENT if self.pointer and not out else out

    def keys(self) -> frozenset[str]:
        return frozenset(key for key, _ in self.fields)


def _or_zero(spec: _Spec, value: Any) -> Any:
    """An element of a list or map: always written, even when zero."""
    out = spec.encode(value)
    return None if out is _ABSENT else out


_STR = _Value()
_ELEM_STR = _Value(omitempty=False)
_STRINGS = _Slice(_ELEM_STR)
_INT = _Value()
_BOOL = _Value()
_PTR = _Pointer()

# loomcycle internal/agents (sign.go AgentContent and the structs it nests).
# Sampling and Compaction fields are all pointers; the ACL structs are plain
# omitempty values; TierCandidate has no omitempty; CoreBlock's label has none.
_SAMPLING = _Struct(
    (
        ("temperature", _PTR),
        ("top_p", _PTR),
        ("top_k", _PTR),
        ("frequency_penalty", _PTR),
        ("presence_penalty", _PTR),
        ("seed", _PTR),
        ("stop", _STRINGS),
    )
)
_COMPACTION = _Struct(
    (
        ("enabled", _PTR),
        ("target_percentage", _PTR),
        ("keep_last_n", _PTR),
        ("keep_first", _PTR),
        ("autocompact_at_pct", _PTR),
        ("model", _PTR),
        ("memory_flush", _PTR),
    )
)
_CHANNELS = _Struct((("publish", _STRINGS), ("subscribe", _STRINGS)))
_INTERRUPTION = _Struct((("enabled", _BOOL), ("kinds", _STRINGS), ("max_pending", _INT)))
_TIER_CANDIDATE = _Struct((("provider", _ELEM_STR), ("model", _ELEM_STR)), pointer=False)
_CORE_BLOCK = _Struct(
    (("label", _ELEM_STR), ("scope", _STR), ("limit_bytes", _INT), ("read_only", _BOOL)),
    pointer=False,
)

# AgentContent's declaration order, limited to the fields this build hashes
# (SPEC 5.2). It is alphabetical except that search_providers precedes sampling.
AGENT_CONTENT = _Struct(
    (
        ("channels", _CHANNELS),
        ("code_body", _STR),  # not normalised: JS whitespace is significant
        ("compaction", _COMPACTION),
        ("core_blocks", _Slice(_CORE_BLOCK)),
        ("description", _STR),
        ("effort", _STR),
        ("evaluation_scopes", _STRINGS),
        ("history_scope", _STRINGS),
        ("inherit_core_blocks", _BOOL),
        ("inject_tool_guide", _BOOL),
        ("internal", _BOOL),
        ("interruption", _INTERRUPTION),
        ("max_concurrent_children", _INT),
        ("max_iterations", _INT),
        ("max_tokens", _INT),
        ("memory_backend", _STR),
        ("memory_consolidation", _BOOL),
        ("memory_index_max_bytes", _INT),
        ("memory_inject_max_tokens", _INT),
        ("memory_protocol", _BOOL),
        ("memory_quota_bytes", _INT),
        ("memory_roots", _STR),
        ("memory_scopes", _STRINGS),
        ("model", _STR),
        ("models", _Map(_Slice(_TIER_CANDIDATE, omitempty=False))),
        ("name", _STR),
        ("provider", _STR),
        ("providers", _STRINGS),
        ("search_providers", _STRINGS),
        ("sampling", _SAMPLING),
        ("sql_quota_bytes", _INT),
        ("sql_scopes", _STRINGS),
        ("system_prompt", _Value(text=True)),
        ("tier", _STR),
        ("tools", _STRINGS),
        ("unbounded_iterations", _BOOL),
    ),
    pointer=False,
)

# internal/skills/sign.go SkillContent. loomcycle renamed the tool list from
# `allowed_tools` to `tools` (the hashed key too); this follows the renamed form.
SKILL_CONTENT = _Struct(
    (("body", _Value(text=True)), ("description", _STR), ("name", _STR), ("tools", _STRINGS)),
    pointer=False,
)

# internal/mcp/sign.go MCPServerContent.
MCP_CONTENT = _Struct(
    (
        ("description", _Value(text=True)),
        ("headers", _Map(_ELEM_STR)),
        ("name", _STR),
        ("transport", _STR),
        ("url", _STR),
    ),
    pointer=False,
)

AGENT_HASH_FIELDS = AGENT_CONTENT.keys()
SKILL_HASH_FIELDS = SKILL_CONTENT.keys()
MCP_HASH_FIELDS = MCP_CONTENT.keys()


def content_sha256(name: str, definition: dict[str, Any], content: _Struct) -> str:
    """The recipe for any kind: `definition` (with `name` from the argument)
    decoded into the `content` struct as Go would, marshalled, hashed."""
    encoded = content.encode({**definition, "name": name})
    return "sha256:" + hashlib.sha256(go_json(encoded).encode()).hexdigest()


def agent_content_sha256(name: str, definition: dict[str, Any]) -> str:
    return content_sha256(name, definition, AGENT_CONTENT)


def skill_content_sha256(name: str, definition: dict[str, Any]) -> str:
    return content_sha256(name, definition, SKILL_CONTENT)


def mcp_content_sha256(name: str, definition: dict[str, Any]) -> str:
    return content_sha256(name, definition, MCP_CONTENT)
