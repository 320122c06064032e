"""Completion webhooks (issue 38): a run's `webhook` (`RunWebhook`, inserted with the run) and
its deliveries (`RunWebhookDelivery`, one per announced event). Written only by
apps.runs.completion.store; imported into apps.runs.models.

- A delivery row is inserted in the transaction that commits the run's end (or its park, for the
  park events a webhook asks for): it exists iff the end does. Unique per (run, event, step), so a
  re-recorded end (the backstop sweep, a redelivered iteration) inserts nothing new.
- Its `id` is the idempotency id the receiver sees (`webhook-id`), the same on every attempt.
- Both reference the run with ON DELETE CASCADE: deleting a run (apps.runs' tree delete, retention,
  erasure) deletes its webhook and deliveries with it.
"""

from __future__ import annotations

from django.db import models


class DeliveryState(models.TextChoices):
    PENDING = "pending"  # not yet answered 2xx; `next_attempt_at` says when it is due
    DELIVERED = "delivered"  # a 2xx answered an attempt
    FAILED = "failed"  # every attempt failed (LOOMCYCLE_RUN_WEBHOOK_MAX_ATTEMPTS), or it can never be sent


class RunWebhook(models.Model):
    # db_constraint=False like every row inserted beside its run's own write (apps.runs.models' docstring).
    run = models.OneToOneField(
        "runs.Run", primary_key=True, on_delete=models.CASCADE, related_name="webhook", db_constraint=False
    )
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    url = models.CharField(max_length=2048)
    secret_ref = models.CharField(max_length=128, blank=True, default="")  # "" = LOOMCYCLE_RUN_WEBHOOK_SECRET
    events = models.JSONField(default=list)  # the run statuses announced (apps.runs.completion.spec.EVENTS)
    ended_recorded = models.BooleanField(default=False)  # its end's delivery row exists (the sweep's marker)

    class Meta:
        indexes = [
            # The backstop sweep looks only at webhooks whose end is not recorded yet.
            models.Index(fields=["run"], name="runwebhook_open", condition=models.Q(ended_recorded=False)),
        ]


class RunWebhookDelivery(models.Model):
    id = models.CharField(primary_key=True, max_length=48)  # whd_<16hex ns><8hex>: the receiver's webhook-id
    # Inserted in the step commit that updates the run row: no FK trigger (apps.runs.models' docstring).
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="webhook_deliveries", db_constraint=False
    )
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    user_id = models.CharField(max_length=128, default="", blank=True)
    event = models.CharField(max_length=32)  # completed | failed | cancelled | awaiting_input | awaiting_interrupt
    step = models.PositiveIntegerField(default=0)
    url = models.CharField(max_length=2048)
    secret_ref = models.CharField(max_length=128, blank=True, default="")
    state = models.CharField(max_length=16, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_status = models.PositiveIntegerField(null=True, blank=True)  # the last attempt's HTTP status
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField()
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "event", "step"], name="runwebhookdelivery_once"),
        ]
        indexes = [
            # The retry sweep scans pending rows only, by due time.
            models.Index(
                fields=["next_attempt_at"], name="runwebhookdelivery_due", condition=models.Q(state="pending")
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.event} {self.state}"
