"""The tool registry and the default-deny policy.

Apps register their agent-facing tools from `AppConfig.ready()`, so the engine
never imports them. A run's tools are operator floor ∩ agent `tools` ∩ caller
`tools`: the caller can narrow, never widen. `Context` is added to an agent's
list unless it sets `disable_context`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from apps.core.tools import Tool

log = logging.getLogger("loomcycle.runs")

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


def effective_tools(
    *, operator: list[str], agent: list[str], caller: list[str] | None, disable_context: bool = False
) -> list[str]:
    """Registered tool names allowed by all three layers, in registry order."""
    agent_patterns = list(agent)
    if not disable_context and "Context" not in agent_patterns:
        agent_patterns.append("Context")
    out = []
    for name in names():
        if not _allowed(operator, name) or not _allowed(agent_patterns, name):
            continue
        if caller is not None and not _allowed(caller, name):
            continue
        out.append(name)
    return out


# --- "run finished" listeners ------------------------------------------------------------
# Apps that start runs and want to hear when they end (apps.triggers' on_complete hooks)
# register here from AppConfig.ready(), as tools do: the engine never imports them. Only
# runs created with `notify_finished` are announced, so other runs pay nothing for it.

RunFinished = Callable[[str, str], None]  # (run_id, terminal status)
_FINISHED: list[RunFinished] = []


def on_run_finished(listener: RunFinished) -> None:
    """Call `listener(run_id, status)` after a notify_finished run's terminal step commits
    (at most once per run from the engine; a listener must itself tolerate a second call)."""
    if listener not in _FINISHED:
        _FINISHED.append(listener)


def run_finished(run_id: str, status: str) -> None:
    """Tell every listener; one listener's failure is logged and does not stop the others."""
    for listener in list(_FINISHED):
        try:
            listener(run_id, status)
        except Exception:  # a listener's bug must not fail the run's (committed) iteration
            log.exception(
                "run %s: a run-finished listener (%s) failed", run_id, getattr(listener, "__name__", listener)
            )
