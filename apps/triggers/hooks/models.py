"""The tables of tool-use hooks (SPEC 2.9, 9.3)."""

from __future__ import annotations

from django.db import models


class HookPhase(models.TextChoices):
    PRE = "pre", "pre"  # before the tool runs: may rewrite its input, deny it, widen its hosts
    POST = "post", "post"  # after it ran: may rewrite its result


class HookFailMode(models.TextChoices):
    OPEN = "open", "open"  # an unreachable/failing callback is passed through
    CLOSED = "closed", "closed"  # ... fails the tool call (is_error)


class HookRegistration(models.Model):
    """A tool-use hook (SPEC 2.9, 9.3), one row per (tenant, owner, name).

    `seq` is the registration order the pre chain runs in (the post chain runs
    it backwards); re-registering an (owner, name) keeps the row and its `seq`
    and gives it a new `hook_id`. `tenant_id` is the registering principal's:
    "" (the deployment's) fires on every run, any other only on that tenant's.
    Written only by apps.triggers.hooks.services."""

    seq = models.BigAutoField(primary_key=True)
    hook_id = models.CharField(max_length=32, unique=True)  # hook_<16hex>
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    owner = models.CharField(max_length=128)
    name = models.CharField(max_length=128)
    phase = models.CharField(max_length=8, choices=HookPhase.choices)
    agents = models.JSONField(default=list)  # exact agent names or "*"
    tools = models.JSONField(default=list)  # exact tool names, "*" or a trailing-* prefix
    callback_url = models.TextField()
    fail_mode = models.CharField(max_length=8, choices=HookFailMode.choices, default=HookFailMode.OPEN)
    timeout_ms = models.IntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "owner", "name"], name="hook_identity"),
            models.CheckConstraint(condition=models.Q(timeout_ms__gte=1, timeout_ms__lte=60_000), name="hook_timeout"),
        ]
        ordering = ["seq"]

    def __str__(self) -> str:
        return f"{self.hook_id} {self.owner}/{self.name} ({self.phase})"
