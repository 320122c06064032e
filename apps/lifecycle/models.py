"""Retention policies, no-trace overrides and erasure audit rows.

`RetentionPolicy`: how many days ended runs of a tenant (agent_name "") or of one agent of a
tenant are kept, set over `/v1/_retention` (it wins over yaml and LOOMCYCLE_RETENTION_DAYS).
`RetentionOverride`: a no-trace agent's runs are stored until `until` (RetentionOverride RPC).
`Erasure`: one person's erasure, its audit row: who (tenant, user id), who asked, when it
started and finished, and rows removed per table. Never any content. A row `running` is
resumed by the next execute of the same person or by beat (`erasure_resume`).
"""

from __future__ import annotations

from django.db import models


class RetentionPolicy(models.Model):
    tenant_id = models.CharField(max_length=128, blank=True, default="")
    agent_name = models.CharField(max_length=128, blank=True, default="")  # "": the tenant's default
    max_age_days = models.PositiveIntegerField()  # 0: kept forever
    updated_by = models.CharField(max_length=160, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant_id", "agent_name"], name="retention_policy_once")]

    def __str__(self) -> str:
        return f"{self.tenant_id or '(default tenant)'}/{self.agent_name or '*'}: {self.max_age_days} d"


class RetentionOverride(models.Model):
    tenant_id = models.CharField(max_length=128, blank=True, default="")
    agent_name = models.CharField(max_length=128)
    until = models.DateTimeField()
    set_by = models.CharField(max_length=160, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant_id", "agent_name"], name="retention_override_once")]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.agent_name} stored until {self.until:%Y-%m-%d %H:%M}"


class ErasureStatus(models.TextChoices):
    RUNNING = "running"
    DONE = "done"


class Erasure(models.Model):
    id = models.CharField(primary_key=True, max_length=32)  # er_<16hex>
    tenant_id = models.CharField(max_length=128, blank=True, default="")
    user_id = models.CharField(max_length=128)
    status = models.CharField(max_length=16, choices=ErasureStatus.choices, default=ErasureStatus.RUNNING)
    requested_by = models.CharField(max_length=160, blank=True, default="")
    counts = models.JSONField(default=dict)  # rows removed (or anonymised) per table, so far
    started_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One erasure of a person at a time: a second execute resumes the first.
            models.UniqueConstraint(
                fields=["tenant_id", "user_id"], condition=models.Q(status="running"), name="erasure_running_once"
            ),
        ]
        indexes = [models.Index(fields=["status"], name="erasure_running", condition=models.Q(status="running"))]

    def __str__(self) -> str:
        return f"{self.id} {self.tenant_id}/{self.user_id} {self.status}"
