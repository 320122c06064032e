"""The join rows of a fan-out (apps.runs.children.fanout): one `FanOut` per
`Agent` parallel_spawn call or `POST /v1/runs:batch` request, one `FanOutSlot`
per child, index-aligned with the request. Written only by
apps.runs.store.fanout; imported into apps.runs.models.

- `reported` counts the slots whose child reported; it moves in the same
  transaction as the slot's `state` (both under the FanOut row lock), so
  exactly one report sees `reported == size` and answers the join.
- A slot refused before any child existed (unknown agent, depth limit) is
  inserted already `reported`, with its `error`.
"""

from __future__ import annotations

from django.db import models


class FanOutKind(models.TextChoices):
    TOOL = "tool"  # an Agent parallel_spawn call: the last report answers the parent's parked call
    BATCH = "batch"  # POST /v1/runs:batch: the last report wakes the waiting request


class SlotState(models.TextChoices):
    WAITING = "waiting"  # its child is a `waiting_fanout` row, not started (over max_concurrent_children)
    STARTED = "started"  # its child was enqueued
    REPORTED = "reported"  # its child ended and was counted (or it was refused: no child)


class FanOut(models.Model):
    id = models.CharField(primary_key=True, max_length=48)  # fo_<16hex ns><8hex>
    kind = models.CharField(max_length=8, choices=FanOutKind.choices)
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    user_id = models.CharField(max_length=128, default="", blank=True)
    parent_run_id = models.CharField(max_length=32, blank=True, default="")  # "" for a batch
    parent_call_id = models.CharField(max_length=128, blank=True, default="")
    size = models.PositiveSmallIntegerField()
    reported = models.PositiveSmallIntegerField(default=0)
    max_concurrent = models.PositiveSmallIntegerField()  # children started at once (the rest wait)
    created_at = models.DateTimeField(auto_now_add=True)
    completed_at = models.DateTimeField(null=True, blank=True)  # set by the report that made reported == size

    class Meta:
        # Deleting a run tree (apps.runs.store.deletion) finds its parallel_spawn joins.
        indexes = [models.Index(fields=["parent_run_id"], name="fanout_parent", condition=~models.Q(parent_run_id=""))]

    def __str__(self) -> str:
        return f"{self.id} {self.kind} {self.reported}/{self.size}"


class FanOutSlot(models.Model):
    fanout = models.ForeignKey(FanOut, on_delete=models.CASCADE, related_name="slots")
    index = models.PositiveSmallIntegerField()
    run_id = models.CharField(max_length=32, null=True, blank=True, unique=True)  # None: refused, no child
    agent = models.CharField(max_length=128)
    parent_context = models.JSONField(null=True, blank=True)  # passed through to the result entry
    state = models.CharField(max_length=8, choices=SlotState.choices)
    error = models.TextField(blank=True, default="")  # a refusal's reason (no child was made)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["fanout", "index"], name="fanout_slot_index")]
        indexes = [
            # The batch report sweep: slots whose child may have ended without its report.
            models.Index(fields=["state"], name="fanout_slot_started", condition=models.Q(state="started")),
        ]

    def __str__(self) -> str:
        return f"{self.fanout_id}[{self.index}] {self.agent} {self.state}"
