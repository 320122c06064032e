"""Versioned, content-addressed definitions (SPEC 5.1) and operator tokens.

Every versioned kind has the same shape: immutable version rows per
(tenant, name) with `parent` lineage, and one pointer row per (tenant, name)
naming the active version and, in the shared tenant, the static yaml entry.
Rows are never edited except for the `retired` flag; a change is a new
version. OperatorTokenDef is not versioned: a token is minted, rotated or
retired, and only its peppered SHA-256 is stored.
"""

from __future__ import annotations

from typing import Any

from django.db import models


class DefSource(models.TextChoices):
    YAML = "yaml", "yaml"
    RUNTIME = "runtime", "runtime"


class VersionedDef(models.Model):
    id = models.CharField(primary_key=True, max_length=32)  # def_<16hex>
    tenant_id = models.CharField(max_length=128, default="", blank=True, db_index=True)  # "" = shared
    name = models.CharField(max_length=128)
    version = models.PositiveIntegerField()
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT, related_name="forks")
    definition = models.JSONField(default=dict)  # snake_case (SPEC appendix D / 5.2)
    description = models.TextField(blank=True, default="")  # the author's rationale, not the def's own description
    content_sha256 = models.CharField(max_length=80, blank=True, default="")  # "" for kinds without a hash
    source = models.CharField(max_length=16, choices=DefSource.choices, default=DefSource.RUNTIME)
    retired = models.BooleanField(default=False)
    bootstrapped_from_static = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True, default="")  # principal subject
    created_by_agent_id = models.CharField(max_length=128, blank=True, default="")
    created_by_run_id = models.CharField(max_length=64, blank=True, default="")

    parent_id: str | None

    class Meta:
        abstract = True
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "name", "version"], name="%(class)s_tenant_name_version"),
        ]
        ordering = ["tenant_id", "name", "-version"]

    def __str__(self) -> str:
        tenant = f"{self.tenant_id}/" if self.tenant_id else ""
        return f"{tenant}{self.name} v{self.version}"

    @property
    def is_operator_yaml(self) -> bool:
        """A version of the operator's yaml (apps.core.privileged trusts it with Bash and host tools)."""
        return self.tenant_id == "" and self.source == DefSource.YAML


class DefPointer(models.Model):
    """Per (tenant, name): the active version, and (shared tenant only) the
    static yaml entry, which top-level runs prefer over shared runtime forks."""

    tenant_id = models.CharField(max_length=128, default="", blank=True)
    name = models.CharField(max_length=128)
    promoted_at = models.DateTimeField(null=True, blank=True)
    promoted_by = models.CharField(max_length=200, blank=True, default="")

    # Each concrete pointer declares both as ForeignKeys to its own kind.
    active_def: Any
    static_def: Any
    active_def_id: str | None
    static_def_id: str | None

    class Meta:
        abstract = True
        constraints = [models.UniqueConstraint(fields=["tenant_id", "name"], name="%(class)s_tenant_name")]

    def __str__(self) -> str:
        return f"{self.tenant_id or '(shared)'}/{self.name}"


class AgentDef(VersionedDef):
    class Meta(VersionedDef.Meta):
        verbose_name = "agent def"


class AgentDefActive(DefPointer):
    active_def = models.ForeignKey(AgentDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    static_def = models.ForeignKey(AgentDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(DefPointer.Meta):
        verbose_name = "agent def pointer"


class SkillDef(VersionedDef):
    class Meta(VersionedDef.Meta):
        verbose_name = "skill def"


class SkillDefActive(DefPointer):
    active_def = models.ForeignKey(SkillDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    static_def = models.ForeignKey(SkillDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(DefPointer.Meta):
        verbose_name = "skill def pointer"


class MCPServerDef(VersionedDef):
    class Meta(VersionedDef.Meta):
        verbose_name = "MCP server def"


class MCPServerDefActive(DefPointer):
    active_def = models.ForeignKey(MCPServerDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    static_def = models.ForeignKey(MCPServerDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(DefPointer.Meta):
        verbose_name = "MCP server def pointer"


class ScheduleDef(VersionedDef):
    class Meta(VersionedDef.Meta):
        verbose_name = "schedule def"


class ScheduleDefActive(DefPointer):
    active_def = models.ForeignKey(ScheduleDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    static_def = models.ForeignKey(ScheduleDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(DefPointer.Meta):
        verbose_name = "schedule def pointer"


class WebhookDef(VersionedDef):
    class Meta(VersionedDef.Meta):
        verbose_name = "webhook def"


class WebhookDefActive(DefPointer):
    active_def = models.ForeignKey(WebhookDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    static_def = models.ForeignKey(WebhookDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(DefPointer.Meta):
        verbose_name = "webhook def pointer"


class A2AServerCardDef(VersionedDef):
    """Which agents this runtime exposes over A2A, and the card it serves for them (apps.a2a.server)."""

    class Meta(VersionedDef.Meta):
        verbose_name = "A2A server card def"


class A2AServerCardDefActive(DefPointer):
    active_def = models.ForeignKey(A2AServerCardDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    static_def = models.ForeignKey(A2AServerCardDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(DefPointer.Meta):
        verbose_name = "A2A server card def pointer"


class A2AAgentDef(VersionedDef):
    """A remote A2A peer an agent may call as a tool (apps.a2a.client)."""

    class Meta(VersionedDef.Meta):
        verbose_name = "A2A agent def"


class A2AAgentDefActive(DefPointer):
    active_def = models.ForeignKey(A2AAgentDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    static_def = models.ForeignKey(A2AAgentDef, null=True, blank=True, on_delete=models.PROTECT, related_name="+")

    class Meta(DefPointer.Meta):
        verbose_name = "A2A agent def pointer"


class ChannelScope(models.TextChoices):
    AGENT = "agent", "agent"
    USER = "user", "user"
    TENANT = "tenant", "tenant"
    GLOBAL = "global", "global"


class ChannelDef(models.Model):
    """A declared channel (SPEC 9.4): yaml ones are immutable, runtime ones
    are created through the channels API. Not versioned."""

    tenant_id = models.CharField(max_length=128, default="", blank=True)
    name = models.CharField(max_length=256)
    scope = models.CharField(max_length=16, choices=ChannelScope.choices, default=ChannelScope.GLOBAL)
    semantic = models.CharField(max_length=16, default="queue", blank=True)  # queue|broadcast|topic (informational)
    default_ttl_seconds = models.PositiveIntegerField(null=True, blank=True)
    max_messages = models.PositiveIntegerField(null=True, blank=True)
    publisher = models.CharField(max_length=32, default="", blank=True)  # "system" refuses agent publish
    period = models.CharField(max_length=64, default="", blank=True)
    description = models.TextField(default="", blank=True)
    source = models.CharField(max_length=16, choices=DefSource.choices, default=DefSource.RUNTIME)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant_id", "name"], name="channeldef_tenant_name")]
        ordering = ["tenant_id", "name"]

    def __str__(self) -> str:
        return self.name


class OperatorTokenDef(models.Model):
    """A bearer token for (tenant, subject, scopes). `token_hash` is
    hex(sha256(pepper || token)); the plaintext is shown once at mint."""

    id = models.CharField(primary_key=True, max_length=32)  # def_<16hex>
    name = models.CharField(max_length=64, db_index=True)
    tenant_id = models.CharField(max_length=128)
    subject = models.CharField(max_length=200)
    scopes = models.JSONField(default=list)
    token_hash = models.CharField(max_length=64, unique=True)
    token_suffix = models.CharField(max_length=16)
    imported = models.BooleanField(default=False)
    rotated_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.CharField(max_length=200, blank=True, default="")
    retired_at = models.DateTimeField(null=True, blank=True)  # valid until then (rotation grace)

    class Meta:
        ordering = ["name", "-created_at"]
        verbose_name = "operator token"

    def __str__(self) -> str:
        return f"{self.name} (…{self.token_suffix})"
