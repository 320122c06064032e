"""Persistent channels (SPEC 6.3, 9.4). A channel is declared by a substrate
`ChannelDef` (yaml or runtime); its messages live here.

A *stream* is (tenant, channel, scope, scope_id): the channel's declared scope
partitions both messages and cursors (agent -> agent name, user -> user_id,
global/tenant -> ""). Messages are read in (visible_at, id) order; a cursor
names the last message read (`cur_<16hex visible_at ns>_<msg id>`).

A `ChannelWait` is a parked Channel subscribe/await: the run that made the
call is parked (`waiting_channel`) and no worker holds it; a publish to one of
its streams, a deferred message becoming visible or the deadline answers it.
"""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models


class ChannelMessage(models.Model):
    id = models.CharField(primary_key=True, max_length=32)  # msg_<16hex publish ns><8hex random>
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    channel = models.CharField(max_length=256)
    scope = models.CharField(max_length=16)
    scope_id = models.CharField(max_length=256, default="", blank=True)
    payload = models.JSONField()
    published_at = models.DateTimeField()
    visible_at = models.DateTimeField()  # published_at, or a future deliver_at
    expires_at = models.DateTimeField(null=True, blank=True, db_index=True)
    published_by = models.CharField(max_length=200, default="", blank=True)  # run id, "_admin" or "_system"
    published_by_user_id = models.CharField(max_length=200, default="", blank=True)
    # The publishing tool call's (run_id, step, call_id) (+ channel for a broadcast): a redelivered
    # iteration that publishes again finds its first message instead of publishing twice.
    idempotency_key = models.CharField(max_length=400, default="", blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"], condition=~models.Q(idempotency_key=""), name="chanmsg_idempotency_key"
            ),
        ]
        indexes = [
            models.Index(
                fields=["tenant_id", "channel", "scope", "scope_id", "visible_at", "id"], name="chanmsg_stream_order"
            ),
            # A person's erasure (apps.channels.erasure): what they published.
            models.Index(
                fields=["tenant_id", "published_by_user_id"],
                name="chanmsg_publisher",
                condition=~models.Q(published_by_user_id=""),
            ),
        ]
        ordering = ["visible_at", "id"]
        verbose_name = "channel message"

    def __str__(self) -> str:
        return f"{self.channel}/{self.id}"


class ChannelCursor(models.Model):
    """The committed read position of one stream (subscribe commits it, ack moves it)."""

    tenant_id = models.CharField(max_length=128, default="", blank=True)
    channel = models.CharField(max_length=256)
    scope = models.CharField(max_length=16)
    scope_id = models.CharField(max_length=256, default="", blank=True)
    cursor = models.CharField(max_length=64, default="", blank=True)  # "" = from the oldest
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "channel", "scope", "scope_id"], name="chancursor_stream"),
        ]
        verbose_name = "channel cursor"

    def __str__(self) -> str:
        return f"{self.channel}:{self.scope}:{self.scope_id}@{self.cursor or 'oldest'}"


class ChannelWait(models.Model):
    """A parked subscribe/await. Deleted in the transaction that answers it."""

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="+")
    call_id = models.CharField(max_length=128)
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    op = models.CharField(max_length=16)  # subscribe | await
    # "<channel>\x1f<scope>\x1f<scope_id>" per stream waited on: what a publish looks up.
    streams = ArrayField(models.CharField(max_length=700))
    request = models.JSONField()  # the call's normalised input (mode, n, max_messages, from cursors)
    deadline = models.DateTimeField()
    wake_at = models.DateTimeField()  # min(deadline, the next deferred message's visible_at)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "call_id"], name="chanwait_run_call")]
        indexes = [
            GinIndex(fields=["streams"], name="chanwait_streams_gin"),
            models.Index(fields=["wake_at"], name="chanwait_wake_at"),
        ]
        verbose_name = "channel wait"

    def __str__(self) -> str:
        return f"{self.run_id}/{self.call_id} ({self.op})"
