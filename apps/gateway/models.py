"""The gateway's two tables: the per-call audit trail and the usage ledger.

`GatewayCall` is one row per /v1/chat/completions, /v1/_llm/chat and
/v1/embeddings call (SPEC 2.11), kept LOOMCYCLE_GATEWAY_AUDIT_RETENTION_DAYS.
`UsageEntry` is one row per provider call, from a run step (`source="run"`,
written by the engine inside its step transaction) or from the gateway
(`source="gateway"`, `run_id` blank): what was spent, by whom, and its price
(`cost_usd` NULL = no price known for that model). Neither table has a foreign
key: the gateway knows nothing of runs, and the ledger outlives what it counts.
"""

from __future__ import annotations

from django.db import models


class Endpoint(models.TextChoices):
    CHAT_COMPLETIONS = "chat.completions"
    LLM_CHAT = "llm.chat"
    EMBEDDINGS = "embeddings"


class UsageSource(models.TextChoices):
    RUN = "run"
    GATEWAY = "gateway"


class GatewayCall(models.Model):
    request_id = models.CharField(max_length=32, db_index=True)  # req_<16hex>
    tenant_id = models.CharField(max_length=128, blank=True, default="")
    user_id = models.CharField(max_length=128, blank=True, default="")
    subject = models.CharField(max_length=128, blank=True, default="")  # the principal's subject
    endpoint = models.CharField(max_length=24, choices=Endpoint.choices)
    provider = models.CharField(max_length=64, blank=True, default="")
    model = models.CharField(max_length=256, blank=True, default="")
    stream = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField()  # 499 = the client went away first
    error_code = models.CharField(max_length=64, blank=True, default="")
    latency_ms = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(db_index=True)  # when the call arrived (retention cuts on it)

    class Meta:
        indexes = [models.Index(fields=["tenant_id", "created_at"], name="gw_call_tenant_created")]

    def __str__(self) -> str:
        return f"{self.request_id} {self.endpoint} {self.status_code}"


class UsageEntry(models.Model):
    created_at = models.DateTimeField()
    tenant_id = models.CharField(max_length=128, blank=True, default="")
    user_id = models.CharField(max_length=128, blank=True, default="")
    run_id = models.CharField(max_length=32, blank=True, default="")  # "" for gateway calls
    step = models.PositiveIntegerField(null=True, blank=True)
    source = models.CharField(max_length=8, choices=UsageSource.choices)
    provider = models.CharField(max_length=64)
    model = models.CharField(max_length=256)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cache_creation_input_tokens = models.PositiveIntegerField(default=0)
    cache_read_input_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)  # NULL = unpriced

    class Meta:
        indexes = [
            models.Index(fields=["tenant_id", "created_at"], name="usage_tenant_created"),
            models.Index(fields=["tenant_id", "user_id", "created_at"], name="usage_tenant_user_created"),
            models.Index(fields=["run_id"], name="usage_run"),
        ]

    def __str__(self) -> str:
        return f"{self.source} {self.provider}/{self.model} {self.input_tokens}+{self.output_tokens}"
