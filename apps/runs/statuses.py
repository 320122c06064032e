"""The run statuses and the groups the engine reasons about, importable without
the app registry (apps.runs.store builds its SQL from them at import time;
apps.runs.models re-exports them)."""

from __future__ import annotations

from django.db.models import TextChoices


class RunStatus(TextChoices):
    QUEUED = "queued"
    WAITING_SLOT = "waiting_slot"  # over `max_concurrent_runs`: not admitted yet (apps.runs.backpressure)
    WAITING_SESSION = "waiting_session"  # enqueued behind its session's live run (apps.runs.sessions.promotion)
    RUNNING = "running"
    AWAITING_INPUT = "awaiting_input"
    WAITING_CHILDREN = "waiting_children"
    AWAITING_INTERRUPT = "awaiting_interrupt"
    WAITING_CHANNEL = "waiting_channel"
    WAITING_FANOUT = "waiting_fanout"  # a parallel_spawn child over max_concurrent_children (apps.runs.children.fanout)
    PAUSED = "paused"
    WAITING_BUDGET = "waiting_budget"  # over a budget that defers: resumes when it frees (apps.budgets)
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


RUNNABLE = (RunStatus.QUEUED, RunStatus.RUNNING)
PARKED = (
    RunStatus.WAITING_SLOT,
    RunStatus.WAITING_SESSION,
    RunStatus.AWAITING_INPUT,
    RunStatus.WAITING_CHILDREN,
    RunStatus.AWAITING_INTERRUPT,
    RunStatus.WAITING_CHANNEL,
    RunStatus.PAUSED,
    RunStatus.WAITING_FANOUT,
    RunStatus.WAITING_BUDGET,
)
TERMINAL = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)
# Not in flight for its session: at most one run of a session is outside these (index run_session_live).
SESSION_IDLE = (*TERMINAL, RunStatus.WAITING_SESSION)
# The parks a tool call's answer (apps.runs.wake.run_answer) can end.
ANSWERABLE = (RunStatus.WAITING_CHILDREN, RunStatus.AWAITING_INTERRUPT, RunStatus.WAITING_CHANNEL)


class ToolCallStatus(TextChoices):
    STARTED = "started"
    FINISHED = "finished"


class InterruptStatus(TextChoices):
    """An Interruption.ask's row (SPEC 6.7): pending until exactly one of the others."""

    PENDING = "pending"
    RESOLVED = "resolved"
    DECLINED = "declined"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


class RuntimeStateValue(TextChoices):
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"


# Run.retention: the run's tree is deleted as soon as it ends (apps.runs.deletion, apps.lifecycle).
NO_TRACE = "no_trace"
