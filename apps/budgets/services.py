"""Writes of the limits (`/v1/_limits`, the admin, the CLI, yaml defaults) and the
wake of the runs a budget deferred.

Who may write what (loomcycle's rule, apps.budgets.authz): the operator any
limit; a tenant admin its own tenant's tenant, user and agent limits. A write
that raises or removes a limit wakes the runs it deferred, after the commit."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.budgets import enforce
from apps.budgets.errors import InvalidLimit
from apps.budgets.models import Kind, OnExceed, Scope, TokenLimit, Window
from apps.core.spend import Spender
from apps.runs import wake

log = logging.getLogger("loomcycle.budgets")


@dataclass(frozen=True)
class LimitSpec:
    tenant_id: str
    scope: str
    scope_id: str = ""
    kind: str = Kind.TOKENS
    window: str = Window.MONTH
    window_hours: int = 0
    soft_limit: Decimal | None = None
    hard_limit: Decimal | None = None
    on_exceed: str = OnExceed.REFUSE


def limit_check(spec: LimitSpec) -> None:
    """400 `invalid_limit` for a limit that cannot be: unknown names, negative thresholds, a soft above the hard."""
    for value, choices, name in (
        (spec.scope, Scope, "scope"),
        (spec.kind, Kind, "kind"),
        (spec.window, Window, "window"),
        (spec.on_exceed, OnExceed, "on_exceed"),
    ):
        if value not in choices.values:
            raise InvalidLimit(f"{name} must be one of: {', '.join(choices.values)} (got {value!r})")
    if spec.scope in (Scope.USER, Scope.AGENT) and not spec.scope_id:
        raise InvalidLimit(f"scope_id (the {spec.scope}) is required for scope={spec.scope}")
    if spec.scope in (Scope.TENANT, Scope.OPERATOR) and spec.scope_id:
        raise InvalidLimit(f"scope_id must be empty for scope={spec.scope}")
    if spec.window == Window.HOURS and not 1 <= spec.window_hours <= 24 * 366:
        raise InvalidLimit("window_hours must be between 1 and 8784 for window=hours")
    if any(v is not None and v < 0 for v in (spec.soft_limit, spec.hard_limit)):
        raise InvalidLimit("soft_limit/hard_limit must be >= 0")
    if spec.soft_limit is not None and spec.hard_limit is not None and spec.soft_limit > spec.hard_limit:
        raise InvalidLimit("soft_limit must not exceed hard_limit")


def limit_put(*, spec: LimitSpec, updated_by: str, source: str = "api") -> TokenLimit:
    """Create or replace one limit (a present threshold is set, an absent one cleared, as loomcycle's PUT)."""
    limit_check(spec)
    with transaction.atomic():
        row, _ = TokenLimit.objects.update_or_create(
            tenant_id=spec.tenant_id,
            scope=spec.scope,
            scope_id=spec.scope_id,
            kind=spec.kind,
            window=spec.window,
            defaults={
                "window_hours": spec.window_hours if spec.window == Window.HOURS else 0,
                "soft_limit": spec.soft_limit,
                "hard_limit": spec.hard_limit,
                "on_exceed": spec.on_exceed,
                "source": source,
                "updated_at": timezone.now(),
                "updated_by": updated_by,
            },
        )
        transaction.on_commit(budgets_wake)
    return row


def limit_delete(*, tenant_id: str, scope: str, scope_id: str, kind: str | None, window: str | None) -> int:
    """Delete the matching limits (every kind and window unless named): that scope is unlimited again."""
    rows = TokenLimit.objects.filter(tenant_id=tenant_id, scope=scope, scope_id=scope_id)
    if kind:
        rows = rows.filter(kind=kind)
    if window:
        rows = rows.filter(window=window)
    with transaction.atomic():
        deleted = rows.delete()[1].get(TokenLimit._meta.label, 0)
        transaction.on_commit(budgets_wake)
    return int(deleted)


def budgets_wake(now: datetime | None = None) -> int:
    """Wake the deferred runs whose budgets admit them now (a window reset, a raised or deleted limit).
    Beat calls it every few seconds; a limit write after its commit. Exactly once per park
    (apps.runs.wake.runs_wake_budget's conditional UPDATE)."""
    woken = 0
    for tenant_id, user_id, agent, _ in wake.budget_waiting_spenders():
        if enforce.admit(Spender(tenant_id, user_id, agent), now).hard is None:
            woken += wake.runs_wake_budget(tenant_id=tenant_id, user_id=user_id, agent=agent)
    if woken:
        log.info("budgets: %d deferred run(s) resumed", woken)
    return woken


def limits_sync_yaml(*, config: dict[str, Any]) -> int:
    """The operator's yaml `limits:` list, as defaults: each entry is written (source yaml) unless
    a limit of the same scope, kind and window was written through the API, the admin or the CLI
    (those win); yaml limits no longer listed are deleted. Inside boot's transaction; a bad
    entry is 400 `invalid_limit` naming its index, and the boot stops."""
    entries = config.get("limits") or []
    if not isinstance(entries, list):
        raise InvalidLimit("limits: want a list of limits")
    kept: set[int] = set()
    for i, entry in enumerate(entries):
        spec = _yaml_spec(i, entry)
        found = TokenLimit.objects.filter(
            tenant_id=spec.tenant_id, scope=spec.scope, scope_id=spec.scope_id, kind=spec.kind, window=spec.window
        ).first()
        if found is not None and found.source != "yaml":
            continue
        kept.add(limit_put(spec=spec, updated_by="yaml", source="yaml").pk)
    TokenLimit.objects.filter(source="yaml").exclude(pk__in=kept).delete()
    return len(kept)


def _yaml_spec(i: int, entry: Any) -> LimitSpec:
    fields = {f for f in LimitSpec.__dataclass_fields__}
    if not isinstance(entry, dict) or set(entry) - fields:
        raise InvalidLimit(f"limits[{i}]: want a mapping of {', '.join(sorted(fields))}")
    try:
        values: dict[str, Any] = {
            k: Decimal(str(v)) if k in ("soft_limit", "hard_limit") and v is not None else v for k, v in entry.items()
        }
        spec = LimitSpec(**{"tenant_id": "", **values})
        limit_check(spec)
    except (InvalidLimit, ArithmeticError, TypeError) as exc:
        raise InvalidLimit(f"limits[{i}]: {exc}") from exc
    return spec
