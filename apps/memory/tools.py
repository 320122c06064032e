"""`Memory`: durable agent state (SPEC 6.2), a thin adapter over the memory services.

The scope_id is never the model's to choose: agent -> the agent's name,
user -> the run's user_id, tenant and global -> "". Rows carry the run's
tenant; global rows live in the deployment's own tenant ("") and are
readable by every tenant's agents but writable only from that tenant. The
scope must be in the agent definition's `memory_scopes` (default-deny).
Every refusal is an `is_error` result whose text says what to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.core.timefmt import ts
from apps.core.tools import Tool, ToolContext, ToolRefusal, ToolResult, op_tool_result
from apps.memory import presenters, selectors, services
from apps.memory.models import MemoryScope
from apps.memory.selectors import MAX_KEY_CHARS
from apps.memory.services import Slot
from apps.substrate.selectors import agent_definition

OPS = ("get", "set", "delete", "list", "incr", "search")
READ_OPS = frozenset({"get", "list", "search"})
FIELDS = frozenset(
    {
        "op",
        "scope",
        "key",
        "value",
        "delta",
        "ttl",
        "prefix",
        "limit",
        "embed",
        "embed_text",
        "query",
        "top_k",
        "rank",
        "dedup",
    }
)


class Refusal(ToolRefusal):
    """A bad call: the message goes back to the model as an is_error result."""


def _policy(ctx: ToolContext) -> tuple[list[str], int | None]:
    definition = agent_definition(ctx.agent_def_id)
    scopes = [s for s in definition.get("memory_scopes") or [] if isinstance(s, str)]
    quota = definition.get("memory_quota_bytes")
    return scopes, quota if isinstance(quota, int) and not isinstance(quota, bool) and quota > 0 else None


def _slot(ctx: ToolContext, scope: Any, op: str, granted: list[str]) -> Slot:
    if scope not in MemoryScope.values:
        raise Refusal(f"scope must be one of {', '.join(MemoryScope.values)} (got {scope!r})")
    if scope not in granted:
        have = ", ".join(granted) if granted else "none: memory is default-deny"
        raise Refusal(f"memory scope {scope!r} is not in this agent's memory_scopes (granted: {have})")
    if scope == MemoryScope.AGENT:
        return Slot(ctx.tenant_id, scope, ctx.agent_name)
    if scope == MemoryScope.USER:
        if not ctx.user_id:
            raise Refusal("scope 'user' needs the run's user_id, and this run has none")
        return Slot(ctx.tenant_id, scope, ctx.user_id)
    if scope == MemoryScope.GLOBAL:
        if op not in READ_OPS and ctx.tenant_id:
            raise Refusal(f"global memory is read-only for tenant {ctx.tenant_id!r}; only the deployment writes it")
        return Slot("", scope, "")
    return Slot(ctx.tenant_id, scope, "")


def _int(data: dict[str, Any], name: str, default: int | None, low: int, high: int) -> int | None:
    value = data.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Refusal(f"{name} must be an integer between {low} and {high} (got {value!r})")
    return value


def _key(data: dict[str, Any]) -> str:
    key = data.get("key")
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise Refusal(f"key must be a non-empty string of at most {MAX_KEY_CHARS} characters")
    return key


def _get(slot: Slot, data: dict[str, Any], quota: int | None) -> dict[str, Any]:
    row = selectors.memory_get(slot=slot, key=_key(data))
    return {"value": row.value if row else None, "expires_at": ts(row.expires_at) if row else None}


def _set(slot: Slot, data: dict[str, Any], quota: int | None) -> dict[str, Any]:
    if "value" not in data or data["value"] is None:
        raise Refusal("set needs a value (any JSON value but null; use op=delete to remove a key)")
    embed_text = data.get("embed_text")
    if embed_text is not None and not isinstance(embed_text, str):
        raise Refusal("embed_text must be a string")
    result = services.memory_set(
        slot=slot,
        key=_key(data),
        value=data["value"],
        ttl_seconds=_int(data, "ttl", None, 1, 10 * 365 * 86400),
        embed=data.get("embed") is True,
        embed_text=embed_text,
        quota_bytes=quota,
    )
    out: dict[str, Any] = {"ok": True, "embedded": result.embedded, "expires_at": ts(result.expires_at)}
    if result.embed_warning:
        out["embed_warning"] = result.embed_warning
    return out


def _delete(slot: Slot, data: dict[str, Any], quota: int | None) -> dict[str, Any]:
    return {"deleted": services.memory_delete(slot=slot, key=_key(data))}


def _list(slot: Slot, data: dict[str, Any], quota: int | None) -> dict[str, Any]:
    prefix = data.get("prefix", "")
    if not isinstance(prefix, str):
        raise Refusal("prefix must be a string")
    limit = _int(data, "limit", 100, 1, 1000) or 100
    rows, truncated = selectors.memory_list(slot=slot, prefix=prefix, limit=limit)
    return {"entries": [presenters.entry_tool(r) for r in rows], "truncated": truncated}


def _incr(slot: Slot, data: dict[str, Any], quota: int | None) -> dict[str, Any]:
    delta = _int(data, "delta", 1, -(2**62), 2**62)
    ttl = _int(data, "ttl", None, 1, 10 * 365 * 86400)
    value, expires_at = services.memory_incr(
        slot=slot, key=_key(data), delta=delta if delta is not None else 1, ttl_seconds=ttl, quota_bytes=quota
    )
    return {"value": value, "expires_at": ts(expires_at)}


def _search(slot: Slot, data: dict[str, Any], quota: int | None) -> dict[str, Any]:
    query = data.get("query")
    if not isinstance(query, str) or not query.strip():
        raise Refusal("search needs a non-empty query string")
    top_k = _int(data, "top_k", 10, 1, 50) or 10
    try:
        rank, dedup = selectors.search_options(data)
    except selectors.BadSearchOptions as exc:
        raise Refusal(str(exc)) from exc
    return presenters.search_out(selectors.memory_search(slot=slot, query=query, top_k=top_k, rank=rank, dedup=dedup))


_HANDLERS: dict[str, Callable[[Slot, dict[str, Any], int | None], dict[str, Any]]] = {
    "get": _get,
    "set": _set,
    "delete": _delete,
    "list": _list,
    "incr": _incr,
    "search": _search,
}


def memory_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    def run(op: str) -> dict[str, Any]:
        granted, quota = _policy(ctx)
        slot = _slot(ctx, data.get("scope"), op, granted)
        return _HANDLERS[op](slot, data, quota)

    return op_tool_result(data, ops=OPS, fields=FIELDS, run=run)


MEMORY_TOOL = Tool(
    name="Memory",
    description="Durable key/value memory that outlives the run. op: get, set (value, optional ttl seconds, "
    "embed=true for search), delete, list (prefix, limit), incr (atomic, delta default 1), search (query, "
    "top_k, rank, dedup). scope: agent (this agent), user (this run's user), tenant, global (read-only "
    "outside the deployment's own tenant); allowed scopes come from the agent's memory_scopes.",
    input_schema={
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": list(OPS)},
            "scope": {"type": "string", "enum": list(MemoryScope.values)},
            "key": {"type": "string"},
            "value": {"description": "Any JSON value (set)."},
            "delta": {"type": "integer", "description": "incr: amount to add (default 1)."},
            "ttl": {"type": "integer", "description": "Seconds until the key expires (set, incr)."},
            "prefix": {"type": "string"},
            "limit": {"type": "integer", "description": "list: 1..1000, default 100."},
            "embed": {"type": "boolean", "description": "set: store an embedding of the value for search."},
            "embed_text": {"type": "string", "description": "set: embed this text instead of the value."},
            "query": {"type": "string"},
            "top_k": {"type": "integer", "description": "search: 1..50, default 10."},
            "rank": {
                "type": "object",
                "properties": {
                    "semantic_weight": {"type": "number"},
                    "recency_weight": {"type": "number"},
                    "recency_half_life_hours": {"type": "number"},
                },
            },
            "dedup": {
                "type": "object",
                "properties": {
                    "enabled": {"type": "boolean"},
                    "threshold": {"type": "number"},
                    "mode": {"type": "string", "enum": ["drop", "merge", "keep"]},
                },
            },
        },
        "required": ["op", "scope"],
        "additionalProperties": False,
    },
    execute=memory_execute,
)
