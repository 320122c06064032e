"""Who may read and write which limits and usage (loomcycle's rule for /v1/_limits):
the operator (admin, the legacy token, open mode) any tenant, with `?tenant=` to
focus; a tenant principal only its own tenant (a differing wire tenant is 403,
never rewritten), and never the operator-global limit."""

from __future__ import annotations

from apps.budgets.errors import LimitForbidden
from apps.budgets.models import Scope
from apps.core.types import Principal


def full_authority(principal: Principal) -> bool:
    return principal.is_admin or principal.legacy or principal.open_mode


def read_tenant(principal: Principal, wire: str | None) -> str | None:
    """The tenant a read covers: None = every tenant (the operator without a focus)."""
    if full_authority(principal):
        return wire or None
    return principal.tenant_id


def write_tenant(principal: Principal, scope: str, wire: str | None) -> str:
    if scope == Scope.OPERATOR:
        if not full_authority(principal):
            raise LimitForbidden("the operator-global budget is the operator's only")
        return ""
    if full_authority(principal):
        return wire or ""
    if wire and wire != principal.tenant_id:
        raise LimitForbidden("a tenant may only manage budgets in its own tenant")
    return principal.tenant_id
