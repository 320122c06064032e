"""The app's tables: hooks and webhooks in their capability modules (re-exported
here), and the schedules' own below: per-schedule state, one row per fire slot,
and the `on_complete` hooks a trigger's run carries.

- `ScheduleState`: one row per ScheduleDef version (SPEC 10's
  `schedule_run_state`), (re)seeded whenever the version becomes active
  (promote, un-retire: substrate's `version_activated` signal) and by a tick
  that finds none, inheriting the previous version's unfired `next_run_at`
  and its pause.
- `ScheduleFire`: one row per (tenant, schedule name, fire time), UNIQUE,
  whichever version fired it, inserted in the transaction that creates the
  fire's run: a slot fires at most once cluster-wide whatever the number of
  ticks racing for it and whatever version is active (a rollback does not
  fire a slot again).
- `SchedulerTick`: one row, the last tick that ran to its end (a late tick
  tells "late" from "down" with it).
- `OnCompleteJob`: the hooks a trigger's run runs when it ends `completed`,
  written in the run's creating transaction (apps.triggers.oncomplete).
"""

from __future__ import annotations

from django.db import models

from apps.substrate.models import ScheduleDef
from apps.triggers.hooks.models import HookFailMode, HookPhase, HookRegistration
from apps.triggers.webhooks.models import Verdict, WebhookDelivery

__all__ = [
    "FireOutcome",
    "HookFailMode",
    "HookPhase",
    "HookRegistration",
    "JobState",
    "OnCompleteJob",
    "ScheduleFire",
    "ScheduleState",
    "SchedulerTick",
    "Verdict",
    "WebhookDelivery",
]


class FireOutcome(models.TextChoices):
    STARTED = "started", "started"  # a run was created
    FAILED = "failed", "failed"  # no run: the agent or its route could not be resolved
    SKIPPED = "skipped", "skipped"  # no run: backpressure or a quota refused it
    SKIPPED_DISABLED = "skipped_disabled", "skipped_disabled"  # the definition has enabled: false


class ScheduleState(models.Model):
    schedule_def = models.OneToOneField(ScheduleDef, primary_key=True, on_delete=models.CASCADE, related_name="+")
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    name = models.CharField(max_length=128)
    next_run_at = models.DateTimeField(null=True, blank=True)  # None: the cron has no next time
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_run_id = models.CharField(max_length=64, blank=True, default="")
    last_status = models.CharField(max_length=32, blank=True, default="")
    last_error = models.TextField(blank=True, default="")
    paused_until = models.DateTimeField(null=True, blank=True)
    fire_count = models.PositiveIntegerField(default=0)  # counted fires (max_fires)
    updated_at = models.DateTimeField(auto_now=True)

    schedule_def_id: str

    class Meta:
        indexes = [models.Index(fields=["next_run_at"], name="schedulestate_next_run")]
        ordering = ["tenant_id", "name"]
        verbose_name = "schedule"

    def __str__(self) -> str:
        return f"{self.tenant_id or '(shared)'}/{self.name}"


class ScheduleFire(models.Model):
    schedule_name = models.CharField(max_length=128)
    schedule_def = models.ForeignKey(ScheduleDef, on_delete=models.CASCADE, related_name="+")
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    fire_time = models.DateTimeField()  # the cron slot (or the run-now moment) this fire is for
    fired_at = models.DateTimeField(auto_now_add=True)
    outcome = models.CharField(max_length=32, choices=FireOutcome.choices)
    counted = models.BooleanField(default=False)  # toward max_fires
    run_id = models.CharField(max_length=64, blank=True, default="")
    error = models.TextField(blank=True, default="")
    run_status = models.CharField(max_length=32, blank=True, default="")  # the run's terminal status, once known
    hook_results = models.JSONField(null=True, blank=True)  # the on_complete hooks' outcomes, once run

    schedule_def_id: str

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant_id", "schedule_name", "fire_time"], name="schedulefire_slot"),
        ]
        indexes = [
            models.Index(
                fields=["fired_at"],
                condition=models.Q(outcome="started", run_status=""),
                name="schedulefire_unfinished",
            ),
            models.Index(fields=["tenant_id", "schedule_name", "-fire_time"], name="schedulefire_by_name"),
            models.Index(fields=["schedule_def", "-fire_time"], name="schedulefire_history"),
            models.Index(fields=["run_id"], name="schedulefire_run"),
        ]
        ordering = ["-fire_time"]
        verbose_name = "schedule fire"

    def __str__(self) -> str:
        return f"{self.schedule_name} @ {self.fire_time:%Y-%m-%d %H:%M:%S}"


class SchedulerTick(models.Model):
    """One row (id 1): when the last tick that ran to its end started."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_tick_at = models.DateTimeField()

    class Meta:
        verbose_name = "scheduler tick"

    def __str__(self) -> str:
        return f"last tick {self.last_tick_at:%Y-%m-%d %H:%M:%S}"


class JobState(models.TextChoices):
    PENDING = "pending", "pending"  # the run has not ended yet
    RUNNING = "running", "running"  # claimed: its hooks are being run (once)
    DONE = "done", "done"  # hooks run (or not due: the run did not complete)


class OnCompleteJob(models.Model):
    run_id = models.CharField(primary_key=True, max_length=64)
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    user_id = models.CharField(max_length=128, blank=True, default="")
    agent_id = models.CharField(max_length=128, blank=True, default="")
    agent_name = models.CharField(max_length=128, blank=True, default="")
    agent_scope_id = models.CharField(max_length=256, blank=True, default="")  # memory.set scope agent
    origin = models.JSONField(default=dict)  # e.g. {"schedule_name": ...}: merged into channel messages
    hooks = models.JSONField(default=list)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.PENDING)
    run_status = models.CharField(max_length=32, blank=True, default="")
    results = models.JSONField(default=list)  # one {kind, ok, error?} per hook, in order
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["state", "created_at"], name="oncompletejob_pending"),
            models.Index(fields=["finished_at"], condition=models.Q(state="done"), name="oncompletejob_done"),
        ]
        verbose_name = "on_complete job"

    def __str__(self) -> str:
        return f"{self.run_id} ({self.state})"
