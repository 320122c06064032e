"""Substrate writes. Invariants: versions per (tenant, name) start at 1 and
increase; the active pointer per (tenant, name) names exactly one def;
yaml-sourced defs are never edited in place (a changed yaml entry is a new
version)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.db.models import Max

from apps.core.errors import Invalid
from apps.core.ids import is_ident, new_def_id
from apps.substrate.hashing import agent_content_sha256, normalise_text
from apps.substrate.models import AgentDef, AgentDefActive, DefSource

log = logging.getLogger("loomcycle.substrate")

_AGENT_KEYS = frozenset(
    {
        "description",
        "provider",
        "model",
        "tier",
        "effort",
        "system_prompt",
        "tools",
        "skills",
        "max_tokens",
        "max_iterations",
        "unbounded_iterations",
        "interactive",
        "disable_context",
        "memory_scopes",
        "channels",
        "sampling",
        "max_concurrent_children",
    }
)


def _normalise_agent(name: str, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise Invalid(f"agent {name!r}: definition must be a mapping", code="config_invalid")
    unknown = set(raw) - _AGENT_KEYS - {"name"}
    if unknown:
        log.warning("agent %s: ignoring fields this build does not use yet: %s", name, sorted(unknown))
    definition = {k: v for k, v in raw.items() if k in _AGENT_KEYS}
    tools = definition.get("tools", [])
    if isinstance(tools, str):  # Claude-Code comma-string form
        tools = [t.strip() for t in tools.split(",") if t.strip()]
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise Invalid(f"agent {name!r}: tools must be a list of names", code="config_invalid")
    definition["tools"] = tools
    if isinstance(definition.get("system_prompt"), str):  # stored as hashed: CRLF -> LF, no trailing space
        definition["system_prompt"] = normalise_text(definition["system_prompt"])
    if "tier" in definition:
        raise Invalid(
            f"agent {name!r}: tier routing arrives with the providers issue; pin provider+model", code="config_invalid"
        )
    if not definition.get("provider") or not definition.get("model"):
        raise Invalid(f"agent {name!r}: provider and model are required", code="config_invalid")
    max_it = definition.get("max_iterations", 16)
    if not isinstance(max_it, int) or max_it < 1:
        raise Invalid(f"agent {name!r}: max_iterations must be a positive integer", code="config_invalid")
    return definition


@transaction.atomic
def agent_def_sync_static(*, name: str, raw: Any) -> AgentDef:
    """Make the yaml entry `name` the active shared def. Idempotent: the same
    content keeps the same def (no new version)."""
    if not is_ident(name):
        raise Invalid(f"agent name {name!r} must match [A-Za-z0-9_-]{{1,128}}", code="config_invalid")
    definition = _normalise_agent(name, raw)
    sha = agent_content_sha256(name, definition)
    # Row lock on the pointer serialises concurrent boots of several processes.
    active = (
        AgentDefActive.objects.select_for_update().select_related("agent_def").filter(tenant_id="", name=name).first()
    )
    # The loomcycle hash leaves out fields this runtime also reads (interactive,
    # disable_context, skills), so "unchanged" means the same definition, not just the same hash.
    if active and active.agent_def.source == DefSource.YAML and active.agent_def.definition == definition:
        return active.agent_def
    same = AgentDef.objects.filter(
        tenant_id="", name=name, content_sha256=sha, source=DefSource.YAML, definition=definition
    ).first()
    if same is None:
        top = AgentDef.objects.filter(tenant_id="", name=name).aggregate(v=Max("version"))["v"] or 0
        same = AgentDef.objects.create(
            id=new_def_id(),
            tenant_id="",
            name=name,
            version=top + 1,
            parent=active.agent_def if active else None,
            definition=definition,
            description=str(definition.get("description", "")),
            content_sha256=sha,
            source=DefSource.YAML,
        )
    AgentDefActive.objects.update_or_create(tenant_id="", name=name, defaults={"agent_def": same})
    return same


def agent_defs_load_yaml(*, config: dict[str, Any]) -> list[AgentDef]:
    agents = config.get("agents") or {}
    if not isinstance(agents, dict):
        raise Invalid("`agents:` must be a mapping of name -> definition", code="config_invalid")
    return [agent_def_sync_static(name=str(name), raw=raw) for name, raw in agents.items()]
