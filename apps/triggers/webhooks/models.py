"""Webhook delivery records: one row per delivery attempt, with its verdict.

The row of a delivery that was acted on (a run spawned, a message published)
has `first=True`; a partial unique index on (tenant_id, webhook_name,
delivery_id) over those rows is the durable dedupe key. It is inserted in the
transaction that creates the run (or publishes the message), so two copies of
one delivery racing on two web processes meet at the index, not in memory.

A signature that does not cover the delivery-id header (a body MAC, or a
Stripe MAC over `"<t>." + body`) also makes what it signs a key: `signed_sha256`,
under a second partial unique index, so a captured delivery re-sent with a
fresh delivery id meets the first copy's row.
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class Verdict(models.TextChoices):
    ACCEPTED = "accepted"
    ACCEPTED_REPLAY = "accepted_replay"
    REJECTED_SIG = "rejected_sig"
    UNRESOLVABLE_SECRET = "unresolvable_secret"  # noqa: S105 (a verdict name, not a secret)
    REJECTED_UNAUTHENTICATED = "rejected_unauthenticated"
    REJECTED_UNKNOWN = "rejected_unknown"
    REJECTED_DISABLED = "rejected_disabled"
    REJECTED_BODY = "rejected_body"
    REJECTED_DELIVERY = "rejected_delivery"
    REJECTED_MAPPING = "rejected_mapping"
    REJECTED_RATE = "rejected_rate"
    REJECTED_SPAWN_SETUP = "rejected_spawn_setup"
    REJECTED_CHANNEL = "rejected_channel"
    REJECTED_SYNC = "rejected_sync"
    TIMEOUT = "timeout"


class WebhookDelivery(models.Model):
    tenant_id = models.CharField(max_length=128, blank=True, default="")
    webhook_name = models.CharField(max_length=200)
    delivery_id = models.CharField(max_length=300)
    verdict = models.CharField(max_length=32, choices=Verdict.choices)
    first = models.BooleanField(default=False)
    run_id = models.CharField(max_length=64, blank=True, default="")
    channel = models.CharField(max_length=200, blank=True, default="")
    detail = models.CharField(max_length=500, blank=True, default="")
    signed_sha256 = models.CharField(max_length=64, blank=True, default="")  # "" when nothing was signed
    received_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant_id", "webhook_name", "delivery_id"],
                condition=models.Q(first=True),
                name="webhookdelivery_once",
            ),
            models.UniqueConstraint(
                fields=["tenant_id", "webhook_name", "signed_sha256"],
                condition=models.Q(first=True) & ~models.Q(signed_sha256=""),
                name="webhookdelivery_signed_once",
            ),
        ]
        indexes = [
            models.Index(fields=["webhook_name", "-received_at"], name="webhookdelivery_recent"),
            # A deleted run tree takes the deliveries that started it (apps.triggers.erasure).
            models.Index(fields=["tenant_id", "run_id"], name="webhookdelivery_run", condition=~models.Q(run_id="")),
        ]

    def __str__(self) -> str:
        return f"{self.webhook_name}/{self.delivery_id}: {self.verdict}"
