"""The tool registry and the default-deny policy.

Apps register their agent-facing tools from `AppConfig.ready()`, so the engine
never imports them. A run's tools are operator floor ∩ agent `tools` ∩ caller
`tools`: the caller can narrow, never widen. `Context` is added to an agent's
list unless it sets `disable_context`.
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


def allowed(patterns: list[str], name: str) -> bool:
    """Whether `name` matches one of `patterns` (exact, `*`, or a trailing-`*` prefix glob)."""
    return any(_matches(p, name) for p in patterns)


def effective_tools(
    *, operator: list[str], agent: list[str], caller: list[str] | None, disable_context: bool = False
) -> list[str]:
    """Registered tool names allowed by all three layers, in registry order."""
    agent_patterns = list(agent)
    if not disable_context and "Context" not in agent_patterns:
        agent_patterns.append("Context")
    out = []
    for name in names():
        if not allowed(operator, name) or not allowed(agent_patterns, name):
            continue
        if caller is not None and not allowed(caller, name):
            continue
        out.append(name)
    return out
