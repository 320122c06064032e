"""Tenant-scoped substrate reads."""

from __future__ import annotations

from apps.core.errors import NotFound
from apps.substrate.models import AgentDef, AgentDefActive


def agent_def_resolve(*, tenant_id: str, name: str) -> AgentDef:
    """Lookup order: the tenant's active def, then the shared one (SPEC 5.1).
    A retired active def resolves as not found."""
    tenants = [tenant_id, ""] if tenant_id else [""]
    for tenant in tenants:
        active = AgentDefActive.objects.select_related("agent_def").filter(tenant_id=tenant, name=name).first()
        if active is not None and not active.agent_def.retired:
            return active.agent_def
    raise NotFound(f'unknown agent "{name}"', code="unknown_agent")


def agent_def_get(*, def_id: str) -> AgentDef:
    try:
        return AgentDef.objects.get(id=def_id)
    except AgentDef.DoesNotExist as exc:
        raise NotFound(f"unknown agent def {def_id}") from exc
