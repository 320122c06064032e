"""The agent-facing def tools `AgentDef` and `SkillDef` (SPEC 6.5).

An agent authors with its own identity: its run's tenant, its effective
tools as the ceiling for `create`, and its `agent_def_scopes` (AgentDef) or
`skills:` patterns (SkillDef) as the names it may touch, default-deny.
Refusals are `is_error` results the model can read and act on.
"""

from __future__ import annotations

from typing import Any

from apps.core.tools import Tool, ToolContext, ToolResult, db_tool_result
from apps.substrate import services
from apps.substrate.kinds import REFUSALS, Kind, get_kind
from apps.substrate.selectors import agent_definition

_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "op": {"type": "string", "enum": ["create", "fork", "get", "list", "retire", "promote", "verify"]},
        "name": {"type": "string", "description": "Definition name (create, fork, list, verify)."},
        "def_id": {"type": "string", "description": "An existing def_id (get, retire, promote)."},
        "parent_def_id": {"type": "string", "description": "Fork parent; default: the name's active version."},
        "overlay": {
            "type": "object",
            "description": "Fields to set (create) or change (fork).",
            "additionalProperties": True,
        },
        "description": {"type": "string", "description": "Why: free-text rationale stored with the version."},
        "promote": {"type": "boolean", "description": "Make it active. create defaults true, fork false."},
        "retired": {"type": "boolean", "description": "retire: true to retire, false to un-retire."},
        "content_sha256": {"type": "string", "description": "verify: the hash you expect to be active."},
    },
    "required": ["op"],
}


def _author(kind: Kind, ctx: ToolContext) -> services.Author:
    definition = agent_definition(ctx.agent_def_id)
    field = "skills" if kind.key == "skill" else "agent_def_scopes"
    scopes = definition.get(field) or []
    return services.Author(
        tenant_id=ctx.tenant_id,
        subject=f"agent:{ctx.agent_name}",
        agent_id=ctx.agent_id,
        run_id=ctx.run_id,
        self_name=ctx.agent_name,
        tools_ceiling=tuple(ctx.tools),
        name_scopes=tuple(str(s) for s in scopes if isinstance(s, str)),
    )


def _make(kind_key: str, description: str) -> Tool:
    def execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
        kind = get_kind(kind_key)  # a refusal reads as its message, as over REST's `error`
        return db_tool_result(lambda: services.def_dispatch(kind, _author(kind, ctx), data), refusals=REFUSALS)

    return Tool(name=get_kind(kind_key).tool, description=description, input_schema=_SCHEMA, execute=execute)


AGENT_DEF_TOOL = _make(
    "agent",
    "Author, fork, promote, retire and inspect agent definitions. Static yaml agents are immutable: fork them. "
    "A fork may narrow `tools`, never widen them. Gated by this agent's agent_def_scopes.",
)
SKILL_DEF_TOOL = _make(
    "skill",
    "Author, fork, promote, retire and inspect skill definitions (overlay: body, description, tools). "
    "Gated by this agent's `skills:` patterns.",
)
