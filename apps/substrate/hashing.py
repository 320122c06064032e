"""Content hash of an AgentDef, following loomcycle's recipe (SPEC 5.3):
hash-significant fields only, alphabetical keys, empty values omitted,
text normalised (CRLF -> LF, trailing whitespace trimmed), compact JSON with
Go's HTML escaping, then "sha256:" + hex."""

from __future__ import annotations

import hashlib
import json
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


def go_json(value: Any) -> str:
    """Compact JSON escaped as Go's encoding/json does by default."""
    out = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return (
        out.replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
        .replace("\u2028", "\\u2028")
        .replace("\u2029", "\\u2029")
    )


def content_sha256(name: str, definition: dict[str, Any], fields: frozenset[str], text: frozenset[str]) -> str:
    """The recipe, for any kind: `fields` are hash-significant, `text` get normalised."""
    content: dict[str, Any] = {"name": name}
    for key, value in definition.items():
        if key not in fields or key == "name":
            continue
        if key in text and isinstance(value, str):
            value = normalise_text(value)
        content[key] = value
    pruned = _prune(content)
    return "sha256:" + hashlib.sha256(go_json(pruned).encode()).hexdigest()


def agent_content_sha256(name: str, definition: dict[str, Any]) -> str:
    return content_sha256(name, definition, AGENT_HASH_FIELDS, _NORMALISED_TEXT)


SKILL_HASH_FIELDS = frozenset({"name", "description", "tools", "body"})
MCP_HASH_FIELDS = frozenset({"name", "description", "transport", "url", "headers"})


def skill_content_sha256(name: str, definition: dict[str, Any]) -> str:
    return content_sha256(name, definition, SKILL_HASH_FIELDS, frozenset({"body"}))


def mcp_content_sha256(name: str, definition: dict[str, Any]) -> str:
    return content_sha256(name, definition, MCP_HASH_FIELDS, frozenset({"description"}))
