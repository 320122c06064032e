"""`Context`: read-only introspection for the running agent (SPEC 6.8).

Ops: `self` (who am I), `tools` (what may I call), `time` (now, UTC),
`history` (this run's transcript so far, with text previews), `agents` (the
agents this run's tenant can name, and whether this run may spawn them),
`skills` (what `Skill` op=list shows), `help` (topics bundled with the
package as apps/runs/help/*.md) and `compact` (compact this run's context
before its next model call: apps.runs.compaction.services). Every read is scoped to the run's tenant
and the shared tenant.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.db import close_old_connections, connection

from apps.core import toolregistry as registry
from apps.core.timefmt import iso_z
from apps.core.tools import Tool, ToolContext, ToolRefusal, ToolResult, db_tool_result
from apps.runs import helptopics
from apps.runs.compaction.services import run_compact_self
from apps.runs.models import TranscriptEntry
from apps.substrate.kinds import get_kind
from apps.substrate.selectors import defs_visible
from apps.substrate.skills import agent_skill_patterns, skills_list

_OPS = ("self", "tools", "time", "history", "agents", "skills", "help", "compact")
_PREVIEW = 200


def _history(ctx: ToolContext, limit: int) -> dict[str, Any]:
    close_old_connections()
    try:
        rows = list(
            TranscriptEntry.objects.filter(run_id=ctx.run_id).order_by("-idx").values("idx", "role", "content")[:limit]
        )
    finally:
        connection.close()  # back to the pool: tools run on short-lived threads
    entries = []
    for row in reversed(rows):
        texts = [b.get("text") or b.get("content") or "" for b in row["content"]]
        kinds = sorted({b.get("type", "") for b in row["content"]})
        preview = " ".join(t for t in texts if isinstance(t, str))[:_PREVIEW]
        entries.append({"index": row["idx"], "role": row["role"], "blocks": kinds, "preview": preview})
    return {"run_id": ctx.run_id, "entries": entries}


def _optional_str(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise ToolRefusal(f"{key} must be a string")
    return (value or "").strip()


def _agents(ctx: ToolContext, data: dict[str, Any]) -> dict[str, Any]:
    """The agents the run's tenant resolves (its own and the shared ones), as
    a run or the Agent tool would resolve each name."""
    prefix = _optional_str(data, "prefix")
    out = []
    for name, row in defs_visible(get_kind("agent"), tenant_id=ctx.tenant_id).items():
        if not name.startswith(prefix):
            continue
        d = row.definition
        summary: dict[str, Any] = {"name": name, "description": str(d.get("description", "")), "def_id": row.id}
        summary |= {"version": row.version, "tenant_id": row.tenant_id, "tools_count": len(d.get("tools") or [])}
        summary |= {k: d[k] for k in ("tier", "provider", "model") if d.get(k)}
        out.append(summary)
    return {"agents": out, "count": len(out), "can_spawn": "Agent" in ctx.tools}


def _skills(ctx: ToolContext, data: dict[str, Any]) -> dict[str, Any]:
    patterns = agent_skill_patterns(ctx.agent_def_id)
    found = skills_list(tenant_id=ctx.tenant_id, patterns=patterns, pattern=_optional_str(data, "pattern"))
    return {"skills": found, "count": len(found), "allowlist": list(patterns), "skill_tool": "Skill" in ctx.tools}


def _help(data: dict[str, Any]) -> ToolResult:
    if "query" in data:  # loomcycle's search over its help index; this runtime serves topics by name only
        return ToolResult("help: query is not supported by this runtime; omit topic for the index", is_error=True)
    topic = data.get("topic")
    if topic is None:
        index = [{"name": t.name, "description": t.description} for t in helptopics.topics()]
        hint = "Call Context op=help topic=<name> to read a topic."
        return ToolResult(json.dumps({"topics": index, "count": len(index), "hint": hint}))
    found = helptopics.get(topic) if isinstance(topic, str) else None
    if found is None:
        valid = ", ".join(t.name for t in helptopics.topics())
        return ToolResult(f"help: topic {topic!r} not found (available: {valid})", is_error=True)
    return ToolResult(json.dumps({"name": found.name, "description": found.description, "content": found.content}))


def context_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    op = data.get("op")
    if op == "agents":
        return db_tool_result(lambda: _agents(ctx, data))
    if op == "skills":
        return db_tool_result(lambda: _skills(ctx, data))
    if op == "help":
        return _help(data)
    if op == "compact":
        return db_tool_result(lambda: run_compact_self(run_id=ctx.run_id))
    if op == "self":
        out: dict[str, Any] = {
            "agent_name": ctx.agent_name,
            "agent_id": ctx.agent_id,
            "run_id": ctx.run_id,
            "session_id": ctx.session_id,
            "user_id": ctx.user_id,
            "tenant_id": ctx.tenant_id,
            "agent_def_id": ctx.agent_def_id,
            "content_sha256": ctx.agent_def_sha256,
            "provider": ctx.provider,
            "model": ctx.model,
            "step": ctx.step,
            "volumes": [  # the bindings, without host paths
                {"name": v.name, "mode": v.mode, "default": v.default, "ephemeral": v.ephemeral} for v in ctx.volumes
            ],
        }
    elif op == "tools":
        offered = registry.resolve(list(ctx.tools), tenant_id=ctx.tenant_id)
        out = {"tools": [{"name": t.name, "description": t.description} for t in offered]}
    elif op == "time":
        now = datetime.now(UTC)
        out = {"now": iso_z(now), "unix": int(now.timestamp()), "timezone": "UTC"}
    elif op == "history":
        limit = data.get("limit", 50)
        if not isinstance(limit, int) or not 1 <= limit <= 500:
            return ToolResult("limit must be an integer between 1 and 500", is_error=True)
        out = _history(ctx, limit)
    else:
        return ToolResult(f"unknown op {op!r}; expected one of {', '.join(_OPS)}", is_error=True)
    return ToolResult(json.dumps(out))


CONTEXT_TOOL = Tool(
    name="Context",
    description="Introspect the current run: op=self (identity), tools (allowed tools), time (UTC now), "
    "history (this run's transcript, optional limit), agents (agents you can name, optional prefix), "
    "skills (skills you may load, optional pattern), help (topic index; topic=<name> reads one), "
    "compact (summarise the earlier conversation before your next model call, keeping the latest turns).",
    input_schema={
        "type": "object",
        "properties": {
            "op": {"type": "string", "enum": list(_OPS)},
            "limit": {"type": "integer", "description": "history: entries, 1..500 (default 50)."},
            "prefix": {"type": "string", "description": "agents: only names starting with this."},
            "pattern": {"type": "string", "description": "skills: `prefix*` or a name."},
            "topic": {"type": "string", "description": "help: the topic to read; omit for the index."},
        },
        "required": ["op"],
        "additionalProperties": False,
    },
    execute=context_execute,
)
