"""`Context`: read-only introspection for the running agent (SPEC 6.8).

Ops: `self` (who am I), `tools` (what may I call), `time` (now, UTC) and
`history` (this run's transcript so far, with text previews).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.db import close_old_connections, connection

from apps.core.timefmt import iso_z
from apps.core.tools import Tool, ToolContext, ToolResult
from apps.runs import registry
from apps.runs.models import TranscriptEntry

_OPS = ("self", "tools", "time", "history")
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


def context_execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    op = data.get("op")
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
        out = {"tools": [{"name": n, "description": t.description} for n in ctx.tools if (t := registry.get(n))]}
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
    "history (this run's transcript, optional limit).",
    input_schema={
        "type": "object",
        "properties": {"op": {"type": "string", "enum": list(_OPS)}, "limit": {"type": "integer"}},
        "required": ["op"],
        "additionalProperties": False,
    },
    execute=context_execute,
)
