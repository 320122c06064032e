"""The tool registry and the default-deny policy.

Apps register their agent-facing tools from `AppConfig.ready()`, so the engine
never imports them. A run's tools are operator floor ∩ agent `tools` ∩ caller
`tools`: the caller can narrow, never widen. `Context` is added to an agent's
list unless it sets `disable_context`, and `Skill` when the agent's `skills:`
patterns allow any skill (anything but none or `-*`). Both still pass the
operator floor and the caller's narrowing.
"""

from __future__ import annotations

from apps.core.tools import Tool

_REGISTRY: dict[str, Tool] = {}


def register(tool: Tool) -> None:
    existing = _REGISTRY.get(tool.name)
    if existing is not None and existing is not tool:
        raise ValueError(f"tool {tool.name!r} registered twice")
    _REGISTRY[tool.name] = tool


def get(name: str) -> Tool | None:
    return _REGISTRY.get(name)


def names() -> list[str]:
    return sorted(_REGISTRY)


def _matches(pattern: str, name: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return name.startswith(pattern[:-1])
    return pattern == name


def _allowed(patterns: list[str], name: str) -> bool:
    return any(_matches(p, name) for p in patterns)


def may_use_skills(skills: list[str]) -> bool:
    """Whether an agent's `skills:` patterns allow any skill at all."""
    return any(p != "-*" for p in skills)


def effective_tools(
    *,
    operator: list[str],
    agent: list[str],
    caller: list[str] | None,
    disable_context: bool = False,
    skills: list[str] | None = None,
) -> list[str]:
    """Registered tool names allowed by all three layers, in registry order."""
    agent_patterns = list(agent)
    if not disable_context and "Context" not in agent_patterns:
        agent_patterns.append("Context")
    if skills and may_use_skills(skills) and "Skill" not in agent_patterns:
        agent_patterns.append("Skill")
    out = []
    for name in names():
        if not _allowed(operator, name) or not _allowed(agent_patterns, name):
            continue
        if caller is not None and not _allowed(caller, name):
            continue
        out.append(name)
    return out
