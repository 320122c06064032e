"""Reads of hook registrations; the tenant is always explicit."""

from __future__ import annotations

from apps.triggers.hooks.types import Hook
from apps.triggers.models import HookRegistration


def hook_list(*, tenant: str | None) -> list[HookRegistration]:
    """One tenant's registrations in chain order; every tenant's for `tenant=None` (an admin)."""
    rows = HookRegistration.objects.all()
    if tenant is not None:
        rows = rows.filter(tenant_id=tenant)
    return list(rows.order_by("seq"))


def hooks_all() -> tuple[Hook, ...]:
    """Every registration in chain (registration) order: what a worker's registry holds."""
    return tuple(Hook.of(row) for row in HookRegistration.objects.order_by("seq"))
