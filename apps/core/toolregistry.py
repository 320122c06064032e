"""The tool registry and the default-deny policy: the floor every app's tools stand on.

Apps register their agent-facing tools here from `AppConfig.ready()`, so the engine
never imports them, and no app needs apps.runs to offer a tool. A run's tools are operator
floor ∩ agent `tools` ∩ caller `tools`: the caller can narrow, never widen. `Context` is
added to an agent's list unless it sets `disable_context`, and `Skill` when the agent's
`skills:` patterns allow any skill (anything but none or `-*`). Both still pass the
operator floor and the caller's narrowing.

An app may also register a tool-call interceptor (`register_interceptor`, at
ready()): apps/runs/toolrun.py hands every allowed call to the interceptors,
outermost first, with the call that runs the tool as the innermost step. The
engine does not know what they do (tool-use hooks, apps/triggers).

Tools that exist per tenant and change at runtime (MCP servers' tools, apps/mcp)
come from a tool provider (`register_provider`, at ready(), with the prefix of its names),
which answers a tenant's current tools; it is asked only when the run's patterns can match
its prefix, and its names never shadow a registered tool's. Every lookup that can see a
provider's tools takes the run's tenant.

What a tool may touch on disk is a run's volume bindings, resolved when the run is created
through the one resolver apps.tools sets here (`set_volume_resolver`).

When a run ends is not a tool's business: that half stays with runs (apps.runs.registry).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from apps.core import privileged
from apps.core.tools import Tool, ToolContext, ToolResult

_REGISTRY: dict[str, Tool] = {}

ToolRunner = Callable[[ToolContext, dict[str, Any]], ToolResult]
"""Runs one call of the tool it was made for: (context, input) -> result."""

Interceptor = Callable[[ToolContext, str, dict[str, Any], ToolRunner], ToolResult]
"""(context, tool name, input, runner) -> result. It decides whether and with
what input to call `runner` (at most once), and may change what it returns.
It must not raise for expected failures (they become is_error results)."""

_INTERCEPTORS: list[Interceptor] = []

ToolProvider = Callable[[str], list[Tool]]
"""(tenant_id) -> the tenant's dynamic tools now (a database read; no network)."""

_PROVIDERS: dict[str, list[ToolProvider]] = {}  # name prefix -> providers of tools named with it


def register(tool: Tool) -> None:
    existing = _REGISTRY.get(tool.name)
    if existing is not None and existing is not tool:
        raise ValueError(f"tool {tool.name!r} registered twice")
    _REGISTRY[tool.name] = tool
    if tool.operator_only:
        privileged.mark(tool.name)


def get(name: str, *, tenant_id: str | None = None) -> Tool | None:
    """The registered tool `name`, else (given a tenant) the providers' tool of that name."""
    found = _REGISTRY.get(name)
    if found is not None or tenant_id is None:
        return found
    return next((t for t in provided(tenant_id, [name]) if t.name == name), None)


def register_provider(provider: ToolProvider, *, prefix: str) -> None:
    """Every tool `provider` gives is named `prefix...` (a run whose patterns cannot
    match the prefix never asks it). Idempotent: ready() may run more than once (tests)."""
    providers = _PROVIDERS.setdefault(prefix, [])
    if provider not in providers:
        providers.append(provider)


def _may_match_prefix(pattern: str, prefix: str) -> bool:
    """Whether `pattern` can match some name that starts with `prefix`."""
    if pattern.endswith("*"):
        stem = pattern[:-1]
        return stem.startswith(prefix) or prefix.startswith(stem)
    return pattern.startswith(prefix)


def provided(tenant_id: str, *pattern_sets: list[str]) -> list[Tool]:
    """The providers' tools for the tenant, minus any that would shadow a registered tool;
    only from providers whose prefix some pattern of every one of `pattern_sets` can match."""
    out = []
    for prefix, providers in _PROVIDERS.items():
        if not all(any(_may_match_prefix(p, prefix) for p in patterns) for patterns in pattern_sets):
            continue
        out += [t for p in providers for t in p(tenant_id) if t.name not in _REGISTRY]
    return out


def resolve(wanted: list[str], *, tenant_id: str) -> list[Tool]:
    """The tools of `wanted` (in that order) that exist now for the tenant; one provider read."""
    unregistered = [n for n in wanted if n not in _REGISTRY]
    dynamic = {t.name: t for t in provided(tenant_id, unregistered)} if unregistered else {}
    return [t for n in wanted if (t := _REGISTRY.get(n) or dynamic.get(n)) is not None]


def register_interceptor(interceptor: Interceptor) -> None:
    """Idempotent: ready() may run more than once in a process (tests)."""
    if interceptor not in _INTERCEPTORS:
        _INTERCEPTORS.append(interceptor)


def intercepted(name: str, runner: ToolRunner) -> ToolRunner:
    """`runner` wrapped in every registered interceptor (the first registered is outermost)."""
    wrapped = runner
    for interceptor in reversed(_INTERCEPTORS):
        wrapped = _wrap(interceptor, name, wrapped)
    return wrapped


def _wrap(interceptor: Interceptor, name: str, inner: ToolRunner) -> ToolRunner:
    return lambda ctx, data: interceptor(ctx, name, data, inner)


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
    tenant_id: str | None = None,
) -> list[str]:
    """Tool names allowed by all three layers: registered ones in registry order,
    then (given a tenant) the providers' tools for it, in their order."""
    agent_patterns = list(agent)
    if not disable_context and "Context" not in agent_patterns:
        agent_patterns.append("Context")
    if skills and may_use_skills(skills) and "Skill" not in agent_patterns:
        agent_patterns.append("Skill")
    layers = [operator, agent_patterns] + ([caller] if caller is not None else [])
    dynamic = [t.name for t in provided(tenant_id, *layers)] if tenant_id is not None else []
    out = []
    for name in names() + dynamic:
        if not allowed(operator, name) or not allowed(agent_patterns, name):
            continue
        if caller is not None and not allowed(caller, name):
            continue
        out.append(name)
    return out


# --- volume bindings ---------------------------------------------------------------------
# apps.tools owns volumes; it registers the function that turns an agent definition's
# `volumes:` into the run's bindings (a sub-agent's within its parent's). Without it a
# run has no filesystem.

VolumeResolver = Callable[..., list[dict[str, Any]]]  # (*, tenant_id, definition, parent_id) -> bindings
_VOLUME_RESOLVER: list[VolumeResolver] = []


def set_volume_resolver(resolver: VolumeResolver) -> None:
    _VOLUME_RESOLVER[:] = [resolver]


def resolve_volumes(*, tenant_id: str, definition: dict[str, Any], parent_id: str | None) -> list[dict[str, Any]]:
    """The run's volume bindings as stored on the run row; raises ApplicationError
    (the run is refused) when the definition binds what the tenant cannot have."""
    if not _VOLUME_RESOLVER:
        return []
    return _VOLUME_RESOLVER[0](tenant_id=tenant_id, definition=definition, parent_id=parent_id)
