"""Versioned, content-addressed definitions (SPEC 5.1).

This issue carries AgentDef with what the engine needs; the substrate issue
adds the other kinds, ops and tokens on the same shape.
"""

from __future__ import annotations

from django.db import models


class DefSource(models.TextChoices):
    YAML = "yaml", "yaml"
    RUNTIME = "runtime", "runtime"


class AgentDef(models.Model):
    id = models.CharField(primary_key=True, max_length=32)  # def_<16hex>
    tenant_id = models.CharField(max_length=128, default="", blank=True)  # "" = shared
    name = models.CharField(max_length=128)
    version = models.PositiveIntegerField()
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="forks")
    definition = models.JSONField(default=dict)  # snake_case overlay (SPEC appendix D)
    description = models.TextField(blank=True, default="")
    content_sha256 = models.CharField(max_length=80)
    source = models.CharField(max_length=16, choices=DefSource.choices, default=DefSource.RUNTIME)
    retired = models.BooleanField(default=False)
    bootstrapped_from_static = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by_agent_id = models.CharField(max_length=128, blank=True, default="")
    created_by_run_id = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "name", "version"], name="agentdef_tenant_name_version"),
        ]
        ordering = ["tenant_id", "name", "-version"]

    def __str__(self) -> str:
        return f"{self.name} v{self.version} ({self.id})"


class AgentDefActive(models.Model):
    """The active version pointer per (tenant, name)."""

    tenant_id = models.CharField(max_length=128, default="", blank=True)
    name = models.CharField(max_length=128)
    agent_def = models.ForeignKey(AgentDef, on_delete=models.PROTECT, related_name="+")
    promoted_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant_id", "name"], name="agentdefactive_tenant_name")]
