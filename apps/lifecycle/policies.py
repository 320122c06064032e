"""The verbs of `/v1/_retention` and the RetentionOverride RPC (both transports call these).

A tenant operator sets its own tenant's ages and overrides; an admin may name another tenant.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime

from apps.core.errors import Invalid
from apps.core.ids import is_ident
from apps.core.types import Principal
from apps.lifecycle import retention
from apps.lifecycle.models import RetentionOverride, RetentionPolicy

MAX_OVERRIDE = timedelta(hours=24)


def acting_tenant(principal: Principal, tenant: str) -> str:
    """The tenant a call acts on: the caller's; an admin's `tenant` when given."""
    return tenant if tenant and principal.is_admin else principal.tenant_id


def _agent(agent: str) -> str:
    if agent and not is_ident(agent):
        raise Invalid("agent must match [A-Za-z0-9_-]{1,128}", code="invalid_agent")
    return agent


def retention_report(*, principal: Principal, tenant: str = "") -> dict[str, Any]:
    """The ages in force for the tenant (and where each comes from) and its overrides."""
    tenant_id = acting_tenant(principal, tenant)
    rows = {(p.tenant_id, p.agent_name): p for p in RetentionPolicy.objects.filter(tenant_id=tenant_id)}
    yaml = {k: v for k, v in retention.yaml_policies().items() if k[0] == tenant_id}
    policies = [
        {"agent": agent, "max_age_days": days, "source": "api" if (tenant_id, agent) in rows else "yaml"}
        for (_, agent), days in sorted({**yaml, **{k: p.max_age_days for k, p in rows.items()}}.items())
    ]
    return {
        "tenant": tenant_id,
        "default_days": retention.default_days(),
        "policies": policies,
        "overrides": overrides_list(principal=principal, tenant=tenant),
    }


def retention_set(*, principal: Principal, agent: str, max_age_days: int, tenant: str = "") -> dict[str, Any]:
    tenant_id = acting_tenant(principal, tenant)
    RetentionPolicy.objects.update_or_create(
        tenant_id=tenant_id,
        agent_name=_agent(agent),
        defaults={"max_age_days": max_age_days, "updated_by": principal.subject},
    )
    return retention_report(principal=principal, tenant=tenant)


def retention_unset(*, principal: Principal, agent: str, tenant: str = "") -> dict[str, Any]:
    RetentionPolicy.objects.filter(tenant_id=acting_tenant(principal, tenant), agent_name=_agent(agent)).delete()
    return retention_report(principal=principal, tenant=tenant)


def _override_out(o: RetentionOverride) -> dict[str, str]:
    return {
        "tenant": o.tenant_id,
        "agent": o.agent_name,
        "until": o.until.isoformat(),
        "set_by": o.set_by,
        "created_at": o.created_at.isoformat(),
    }


def overrides_list(*, principal: Principal, tenant: str = "") -> list[dict[str, str]]:
    """Overrides in force: an admin without `tenant` sees every tenant's."""
    qs = RetentionOverride.objects.filter(until__gt=timezone.now()).order_by("tenant_id", "agent_name")
    if not (principal.is_admin and not tenant):
        qs = qs.filter(tenant_id=acting_tenant(principal, tenant))
    return [_override_out(o) for o in qs]


def _until(raw: str) -> datetime:
    until = parse_datetime(raw or "")
    if until is None or until.tzinfo is None:
        raise Invalid("until must be an RFC 3339 time with a zone", code="invalid_until")
    now = timezone.now()
    if not now < until <= now + MAX_OVERRIDE:
        raise Invalid("until must be in the future and at most 24 hours ahead", code="invalid_until")
    return until


def override_set(*, principal: Principal, agent: str, until: str, tenant: str = "") -> dict[str, str]:
    """Store the runs of the no-trace `agent` until `until` (replaces its last override)."""
    if not agent:
        raise Invalid("agent is required", code="invalid_agent")
    row, _ = RetentionOverride.objects.update_or_create(
        tenant_id=acting_tenant(principal, tenant),
        agent_name=_agent(agent),
        defaults={"until": _until(until), "set_by": principal.subject},
    )
    return _override_out(row)


def override_clear(*, principal: Principal, agent: str, tenant: str = "") -> bool:
    deleted, _ = RetentionOverride.objects.filter(
        tenant_id=acting_tenant(principal, tenant), agent_name=_agent(agent), until__gt=timezone.now()
    ).delete()
    return deleted > 0
