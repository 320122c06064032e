"""Budgets (issue 37): the limits, their per-window counters, the holds a
provider call in flight keeps on them, the once-per-run notices, and the runs
parked until a budget frees.

Postgres is the truth. A `LimitWindow` row counts what one window of one limit
has spent (`used`, from the ledger's calls as they settle) and what calls in
flight have reserved (`held`). A call may start only if it can reserve on every
hard limit in scope: `UPDATE ... SET held = held + :estimate WHERE used + held
< hard_limit` (apps.budgets.enforce), so two workers never both take the last of
a budget."""

from __future__ import annotations

from django.db import models


class Scope(models.TextChoices):
    OPERATOR = "operator"  # every tenant together (operator only)
    TENANT = "tenant"
    USER = "user"  # one user within a tenant
    AGENT = "agent"  # one agent name within a tenant


class Kind(models.TextChoices):
    TOKENS = "tokens"  # input + output + cache write + cache read
    INPUT = "input_tokens"  # input + cache write + cache read
    OUTPUT = "output_tokens"
    COST = "cost_usd"  # list price (apps.gateway.pricing); unpriced calls add nothing


class Window(models.TextChoices):
    MONTH = "month"  # the calendar month, UTC (loomcycle's)
    DAY = "day"  # the UTC day
    HOURS = "hours"  # the last `window_hours` hours, rolling (apps.budgets.rolling)


class OnExceed(models.TextChoices):
    REFUSE = "refuse"  # 429 at admission, stop at the next iteration boundary
    DEFER = "defer"  # park as waiting_budget until the window resets or the limit is raised


class TokenLimit(models.Model):
    tenant_id = models.CharField(max_length=128, blank=True, default="")  # "" for scope=operator
    scope = models.CharField(max_length=16, choices=Scope.choices)
    scope_id = models.CharField(max_length=128, blank=True, default="")  # the user or agent name
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TOKENS)
    window = models.CharField(max_length=8, choices=Window.choices, default=Window.MONTH)
    window_hours = models.PositiveIntegerField(default=0)  # window=hours only
    soft_limit = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    hard_limit = models.DecimalField(max_digits=20, decimal_places=6, null=True, blank=True)
    on_exceed = models.CharField(max_length=8, choices=OnExceed.choices, default=OnExceed.REFUSE)
    source = models.CharField(max_length=8, default="api")  # api | yaml (the operator's defaults)
    updated_at = models.DateTimeField()
    updated_by = models.CharField(max_length=128, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "scope", "scope_id", "kind", "window"], name="limit_unique")
        ]
        indexes = [models.Index(fields=["tenant_id", "scope", "scope_id"], name="limit_lookup")]

    def __str__(self) -> str:
        return f"{self.scope} {self.tenant_id}/{self.scope_id} {self.kind}/{self.window}"


class LimitsGeneration(models.Model):
    """One row (id 1) whose `n` every write of `TokenLimit` bumps, in its own transaction, by a
    statement trigger (migration 0004): any path, the ORM, the admin, yaml, raw SQL, a cascade.
    The claim reads it (apps.core.spend.LIMITS_GENERATION_SQL) so the gate re-reads the limits
    only when they changed (apps.budgets.enforce)."""

    n = models.BigIntegerField(default=0)


class LimitWindow(models.Model):
    """One window of a limit. A rolling limit (window=hours) has one row for ever (start = the
    Unix epoch): `used` is all it ever spent, and `LimitSpend` says how much of it has aged out."""

    limit = models.ForeignKey(TokenLimit, on_delete=models.CASCADE, related_name="windows")
    start = models.DateTimeField()
    used = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    held = models.DecimalField(max_digits=20, decimal_places=6, default=0)
    last_at = models.DateTimeField(null=True, blank=True)  # rolling: the latest spend's stamp (kept monotone)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["limit", "start"], name="limit_window_unique")]


class LimitSpend(models.Model):
    """A rolling window's running total after one settle: `total` = its `used` once the spend
    stamped `at` was added. The spend of the last N hours is `used` less the total of the latest
    row at or before now - N hours (one backward index probe, however busy the window)."""

    window = models.ForeignKey(LimitWindow, on_delete=models.CASCADE, related_name="spends", db_index=False)
    at = models.DateTimeField()
    total = models.DecimalField(max_digits=24, decimal_places=6)

    class Meta:
        indexes = [models.Index(fields=["window", "at", "total"], name="limit_spend_at")]


class LimitHold(models.Model):
    """What one provider call in flight reserved on one window; `key` is `run:<id>` or `gw:<request id>`."""

    key = models.CharField(max_length=64)
    window = models.ForeignKey(LimitWindow, on_delete=models.CASCADE, related_name="holds")
    amount = models.DecimalField(max_digits=20, decimal_places=6)
    step = models.IntegerField(null=True, blank=True)  # the run step whose ledger rows settle it
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["key", "window"], name="limit_hold_unique")]
        indexes = [models.Index(fields=["created_at"], name="limit_hold_age")]


class LimitNotice(models.Model):
    """A `limit` event a run has had: one per (scope, severity) per run (SPEC 3.3), whichever of
    that scope's limits crossed first (`limit_id`). A run has one tenant, user and agent, so the
    scope names one budget holder; its limits of several kinds or windows share the one event."""

    run_id = models.CharField(max_length=32)
    limit_id = models.BigIntegerField()
    scope = models.CharField(max_length=16, default="")
    severity = models.CharField(max_length=4)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run_id", "scope", "severity"], name="limit_notice_once")]
