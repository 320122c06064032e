"""The `Skill` tool (SPEC 6.11): list the skills an agent may use, and load one.

Invariants:
- The agent's `skills:` patterns gate both ops, default-deny: no patterns
  (or only `-*`) means no skill, and then the tool is not even offered
  (`apps.core.toolregistry.effective_tools`). The same patterns gate SkillDef
  authoring (`apps.substrate.services`), through `skill_pattern_allows`.
- Resolution is tenant-scoped: the run's tenant's active version, then the
  shared tenant's active version, then the static yaml one. Another tenant's
  skill is invisible: not listed, and "unknown" when named.
- A skill never widens its agent: `invoke` refuses a skill whose `tools`
  are not all among the run's tools.
- The tool is built by `make_skill_tool` with the registry's name listing
  passed in (from `AppConfig.ready()`), so this module imports nothing of
  apps.runs.
- What `invoke` loads is recorded: a `skill_loaded` event carries the def
  id, version and content hash of the exact version whose body the model got.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.db import close_old_connections, connection

from apps.core.tools import Tool, ToolContext, ToolRefusal, ToolResult, db_tool_result
from apps.substrate.kinds import get_kind
from apps.substrate.models import VersionedDef
from apps.substrate.selectors import agent_definition, def_name_exists, defs_visible, skill_resolve

_OPS = ("invoke", "list")
_FIELDS = frozenset({"op", "name", "pattern"})
_HINT_NAMES = 10


def skill_pattern_allows(pattern: str, name: str) -> bool:
    """One `skills:` pattern: `*` (any), `prefix*` (by prefix), an exact
    name; `-*` allows nothing."""
    if pattern == "-*":
        return False
    if pattern == "*":
        return True
    return name.startswith(pattern[:-1]) if pattern.endswith("*") else pattern == name


def skills_allow(patterns: Iterable[str], name: str) -> bool:
    return any(skill_pattern_allows(p, name) for p in patterns)


def agent_skill_patterns(agent_def_id: str) -> tuple[str, ...]:
    """The `skills:` patterns of the run's agent version (cached per process)."""
    raw = agent_definition(agent_def_id).get("skills") or []
    return tuple(p for p in raw if isinstance(p, str))


def skills_list(*, tenant_id: str, patterns: Iterable[str], pattern: str = "") -> list[dict[str, str]]:
    """The skills the tenant can resolve that the patterns allow (and the
    optional `pattern` filter, same syntax), sorted by name."""
    allowed = tuple(patterns)
    out = []
    for name, row in defs_visible(get_kind("skill"), tenant_id=tenant_id).items():
        if not skills_allow(allowed, name) or (pattern and not skill_pattern_allows(pattern, name)):
            continue
        out.append({"name": name, "description": str(row.definition.get("description", ""))})
    return out


def _missing_tools(skill_tools: list[str], run_tools: tuple[str, ...], registered: list[str]) -> list[str]:
    """The skill's tools the run does not have. A glob is covered only when
    every registered tool it matches is among the run's tools."""
    have = set(run_tools)
    missing = []
    for wanted in skill_tools:
        if wanted.endswith("*"):
            matched = [n for n in registered if n.startswith(wanted[:-1])]
            covered = bool(matched) and all(n in have for n in matched)
        else:
            covered = wanted in have
        if not covered:
            missing.append(wanted)
    return missing


def loaded_event(row: VersionedDef) -> dict[str, Any]:
    return {
        "type": "skill_loaded",
        "skill": {
            "name": row.name,
            "def_id": row.id,
            "version": row.version,
            "content_sha256": row.content_sha256,
            "tenant_id": row.tenant_id,
            "source": row.source,
        },
    }


def _unknown(ctx: ToolContext, patterns: tuple[str, ...], name: str) -> str:
    if def_name_exists(get_kind("skill"), tenant_id=ctx.tenant_id, name=name):
        return f"skill {name!r} has no active version (retired, or never promoted)"
    names = [s["name"] for s in skills_list(tenant_id=ctx.tenant_id, patterns=patterns)]
    hint = ", ".join(names[:_HINT_NAMES]) + (", ..." if len(names) > _HINT_NAMES else "")
    return f"unknown skill {name!r}" + (f" (available: {hint})" if names else " (no skills are available to you)")


def _invoke(ctx: ToolContext, name: Any, registered: Callable[[], list[str]]) -> ToolResult:
    if not isinstance(name, str) or not name.strip():
        return ToolResult("invoke needs `name`: the skill to load (op=list shows them)", is_error=True)
    patterns = agent_skill_patterns(ctx.agent_def_id)
    if not skills_allow(patterns, name):
        return ToolResult(f"skill {name!r} is not permitted by this agent's `skills:` allowlist", is_error=True)
    row = skill_resolve(tenant_id=ctx.tenant_id, name=name)
    if row is None:
        return ToolResult(_unknown(ctx, patterns, name), is_error=True)
    missing = _missing_tools(list(row.definition.get("tools") or []), ctx.tools, registered())
    if missing:
        return ToolResult(
            f"skill {name!r} needs tools {missing} this run does not have; a skill cannot widen its agent's tools",
            is_error=True,
        )
    return ToolResult(str(row.definition["body"]), events=(loaded_event(row),))


def _list(ctx: ToolContext, pattern: Any) -> dict[str, Any]:
    if pattern is not None and not isinstance(pattern, str):
        raise ToolRefusal("pattern must be a string")
    found = skills_list(
        tenant_id=ctx.tenant_id, patterns=agent_skill_patterns(ctx.agent_def_id), pattern=(pattern or "").strip()
    )
    return {"skills": found, "count": len(found)}


def _execute(ctx: ToolContext, data: dict[str, Any], registered: Callable[[], list[str]]) -> ToolResult:
    op = data.get("op") or "invoke"  # loomcycle: `{"name": ...}` alone invokes
    if op not in _OPS:
        return ToolResult(f"unknown op {op!r}; this runtime supports {', '.join(_OPS)}", is_error=True)
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        return ToolResult(f"unknown fields {unknown}", is_error=True)
    if op == "list":
        return db_tool_result(lambda: _list(ctx, data.get("pattern")))
    close_old_connections()
    try:
        return _invoke(ctx, data.get("name"), registered)
    finally:
        connection.close()  # back to the pool: tools run on short-lived threads


_DESCRIPTION = (
    "Load domain-specific instructions (skills) on demand. op=list shows the skills you may use "
    "(name, description; optional `pattern`: `*`, `prefix*` or a name); op=invoke with `name` returns that "
    "skill's body as the result: read it and follow it for the task at hand. Your agent's `skills:` allowlist "
    "decides which skills you may use. Guide: Context op=help topic=skills."
)
_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "op": {"type": "string", "enum": list(_OPS), "description": "invoke (default) or list"},
        "name": {"type": "string", "description": "op=invoke: the skill to load."},
        "pattern": {"type": "string", "description": "op=list: optional filter, `prefix*` or a name."},
    },
    "additionalProperties": False,
}


def make_skill_tool(registered: Callable[[], list[str]]) -> Tool:
    """The `Skill` tool; `registered` lists the registered tool names (for a
    skill's `prefix*` tools, covered only when the run has every match)."""

    def execute(ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
        return _execute(ctx, data, registered)

    return Tool(name="Skill", description=_DESCRIPTION, input_schema=_SCHEMA, execute=execute)
