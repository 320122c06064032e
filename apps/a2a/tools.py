"""Remote A2A agents as agent tools: the tool registry's provider (apps.core.toolregistry).

For a tenant, every A2AAgentDef it can see (its own, then the shared ones) offers one tool
per expected skill, named `a2a__<peer>__<skill>` (characters outside `[A-Za-z0-9_-]` as
`_`), or `a2a__<peer>__default` (no skill id sent) when it lists none. An agent grants them
with its `tools:` (`a2a__<peer>__*`); they pass the same policy, hooks and redaction as any
tool. A database read per lookup: no peer is contacted to list tools.
"""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from apps.a2a import calls
from apps.a2a.peers import Peer
from apps.core.tools import Tool, ToolContext, ToolResult
from apps.substrate.kinds import get_kind
from apps.substrate.models import VersionedDef
from apps.substrate.selectors import defs_visible

PREFIX = "a2a__"
DEFAULT_SKILL = "default"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
SCHEMA = {
    "type": "object",
    "properties": {"prompt": {"type": "string", "description": "the message to the remote agent"}},
    "required": ["prompt"],
    "additionalProperties": False,
}


def tool_name(peer: str, skill: str) -> str:
    return f"{PREFIX}{_UNSAFE.sub('_', peer)}__{_UNSAFE.sub('_', skill)}"


def a2a_tools(tenant_id: str) -> list[Tool]:
    out: dict[str, Tool] = {}
    for row in defs_visible(get_kind("a2aagent"), tenant_id=tenant_id).values():
        skills: list[str | None] = [str(s["id"]) for s in row.definition.get("expected_skills") or []]
        for skill in skills or [None]:
            tool = _tool(row, skill)
            out.setdefault(tool.name, tool)
    return list(out.values())


def _tool(row: VersionedDef, skill: str | None) -> Tool:
    name = tool_name(row.name, skill or DEFAULT_SKILL)
    about = row.definition.get("description") or f"the remote A2A agent {row.name!r}"
    return Tool(
        name=name,
        description=f"Send a message to {about}"
        + (f" (skill {skill})" if skill else "")
        + "; its answer is the result.",
        input_schema=SCHEMA,
        execute=partial(_execute, row, skill, name),
    )


def _execute(row: VersionedDef, skill: str | None, name: str, ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return ToolResult("prompt must be a non-empty string", is_error=True)
    return calls.call(ctx, Peer.of(row), skill=skill, prompt=prompt, tool_name=name)
