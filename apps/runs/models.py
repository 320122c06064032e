"""Runs, their events, their append-only transcript, steering inputs and tool calls.

The child tables reference runs without a database FK constraint: their rows
are inserted by apps.runs.store, almost always in the statement that updates
that very run (the step commit, the claim, an answer, a cancel, run creation),
and an FK trigger per inserted row would lock the hottest row (`FOR KEY
SHARE`) six times per iteration. Django still cascades deletes.

A run is a row; a worker holds it only for one iteration (lease + fencing
token). `step` counts committed iterations; `last_seq` and `transcript_len`
are the counters every append advances in the UPDATE of the run row
(apps.runs.store's append primitive), so event seqs and transcript indexes
are consecutive without a separate lock.
"""

from __future__ import annotations

from django.db import models

from apps.runs.statuses import PARKED as PARKED
from apps.runs.statuses import RUNNABLE as RUNNABLE
from apps.runs.statuses import SESSION_IDLE as SESSION_IDLE
from apps.runs.statuses import TERMINAL as TERMINAL
from apps.runs.statuses import InterruptStatus as InterruptStatus
from apps.runs.statuses import RunStatus as RunStatus
from apps.runs.statuses import RuntimeStateValue as RuntimeStateValue
from apps.runs.statuses import ToolCallStatus as ToolCallStatus
from apps.substrate.models import AgentDef

# An ended top-level run: what retention deletes (with its tree).
_ENDED_ROOT = models.Q(parent__isnull=True) & models.Q(status__in=["completed", "failed", "cancelled"])


class Run(models.Model):
    id = models.CharField(primary_key=True, max_length=32)  # r_<16hex>
    agent_id = models.CharField(max_length=128)  # caller handle, a_<16hex> by default; unique per tenant
    session_id = models.CharField(max_length=32, db_index=True)  # s_<16hex>
    # Sessions (apps.runs.sessions.promotion): the run's place in its session (0 = the run that made it),
    # whether its model sees the session's earlier turns (POST /v1/sessions/{id}/messages), and
    # whether a `rollback` dropped its turn from the history later runs replay.
    session_turn = models.PositiveIntegerField(default=0)
    replays_session = models.BooleanField(default=False)
    session_rolled_back = models.BooleanField(default=False)
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    user_id = models.CharField(max_length=128, default="", blank=True)
    agent_name = models.CharField(max_length=128)
    agent_def = models.ForeignKey(AgentDef, on_delete=models.PROTECT, related_name="runs")
    agent_def_sha256 = models.CharField(max_length=80)
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    parent_call_id = models.CharField(max_length=128, blank=True, default="")  # the parent's Agent tool call
    depth = models.PositiveSmallIntegerField(default=0)  # 0 = top-level run
    pending_calls = models.PositiveIntegerField(default=0)  # parked tool calls not yet answered (children, waits)
    reported_to_parent = models.BooleanField(default=False)  # this child's result reached its parent

    status = models.CharField(max_length=24, choices=RunStatus.choices, default=RunStatus.QUEUED)
    step = models.PositiveIntegerField(default=0)
    attempts = models.PositiveIntegerField(default=0)
    lease_owner = models.CharField(max_length=128, blank=True, default="")
    lease_until = models.DateTimeField(null=True, blank=True)
    lease_token = models.BigIntegerField(default=0)
    cancel_requested = models.BooleanField(default=False)
    cancel_reason = models.CharField(max_length=1024, blank=True, default="")
    # Turn-cancel of an interactive run (apps.runs.engine.turncancel): the running iteration stops its
    # model turn or tool batch and re-parks at awaiting_input; the step commit that parks clears it.
    turn_cancel_requested = models.BooleanField(default=False)
    turn_cancel_reason = models.CharField(max_length=1024, blank=True, default="")
    # Fork lineage (apps.runs.fork): the run whose transcript up to `forked_at_step` this run started from.
    forked_from_run = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks", db_constraint=False
    )
    forked_at_step = models.PositiveIntegerField(null=True, blank=True)

    provider = models.CharField(max_length=64)  # the candidate in use (changes on a fallback)
    model = models.CharField(max_length=256)
    # Resolved routing (apps.gateway.resolver): {"candidates": [{provider, model}],
    # "policy": {fallback_on_error, max_fallback_attempts, retry_attempts},
    # "user_tier", "tier", "effort", "sampling"}.
    routing = models.JSONField(default=dict)
    candidate_idx = models.PositiveIntegerField(default=0)
    fallbacks = models.PositiveIntegerField(default=0)  # provider switches so far
    system = models.JSONField(default=list)  # resolved system blocks (agent prompt, system segments, metadata)
    max_tokens = models.PositiveIntegerField(default=4096)
    interactive = models.BooleanField(default=False)
    max_iterations = models.PositiveIntegerField(default=16)
    tools = models.JSONField(default=list)  # effective tool names (operator ∩ agent ∩ caller)
    # The creating request's `tools` narrowing (None: none); sub-agents inherit it as their caller layer.
    caller_tools = models.JSONField(null=True, blank=True)
    # Where the network tools may go (apps.core.hosts.run_allowed_hosts; [] = nowhere); sub-agents inherit it.
    allowed_hosts = models.JSONField(default=list)
    # Resolved volume bindings (apps.core.tools.VolumeBinding.as_dict()); sub-agents get a subset.
    volumes = models.JSONField(default=list, blank=True)
    metadata = models.JSONField(default=dict)
    # The caller's opaque lineage (SPEC 2.3 `parent_context`; apps.runs.run_options): returned as given,
    # inherited by sub-agents.
    parent_context = models.JSONField(null=True, blank=True)
    # user_bearer + user_credentials, AES-GCM sealed (apps.runs.credentials); "" once the run is terminal.
    credentials_sealed = models.TextField(blank=True, default="")
    # Created by a trigger that wants to hear when it ends (apps.runs.registry.on_run_finished):
    # the engine calls the listeners only for these, so other runs pay nothing for the seam.
    notify_finished = models.BooleanField(default=False)
    # The W3C `traceparent` of the run's root span (apps.runs.tracing): every iteration, on
    # whichever worker, is its child, so the run is one trace. Empty when tracing is off.
    trace_context = models.CharField(max_length=64, blank=True, default="")
    # "" (kept for the tenant's / agent's retention age) or "no_trace" (the tree is deleted when it
    # ends): the request's `retention`, else the agent's, inherited by sub-agents (apps.lifecycle).
    # A database default, so a worker of the previous release inserts runs without naming it.
    retention = models.CharField(max_length=16, blank=True, default="", db_default="")
    stop_reason = models.CharField(max_length=128, blank=True, default="")
    error = models.TextField(blank=True, default="")
    usage = models.JSONField(default=dict)
    last_seq = models.PositiveIntegerField(default=0)
    transcript_len = models.PositiveIntegerField(default=0)
    pending_inputs = models.PositiveIntegerField(default=0)  # RunInput rows not yet drained

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # Per tenant, so another tenant's agent_id can be neither probed (409) nor squatted.
            # agent_id first: the index also serves an admin's lookup by agent_id alone.
            models.UniqueConstraint(fields=["agent_id", "tenant_id"], name="run_tenant_agent_id"),
            # One in-flight run per session, cluster-wide (apps.runs.sessions.promotion): enqueued runs
            # (`waiting_session`) and ended ones are outside the index.
            models.UniqueConstraint(
                fields=["session_id"],
                name="run_session_live",
                condition=models.Q(parent__isnull=True) & ~models.Q(status__in=SESSION_IDLE),
            ),
        ]
        indexes = [
            models.Index(fields=["tenant_id", "user_id", "status"], name="run_user_status"),
            # The sweeper scans live runs only. lease_until is deliberately NOT
            # indexed: claims and step commits then update the row HOT (no index
            # writes), which is most of Postgres's cost per iteration.
            models.Index(fields=["status"], name="run_live", condition=models.Q(status__in=["queued", "running"])),
            # Admission (apps.runs.backpressure) counts live top-level runs and takes the
            # oldest waiting ones from here; a step commit that keeps its status stays HOT.
            models.Index(
                fields=["status", "created_at"],
                name="run_top_live",
                condition=models.Q(parent__isnull=True) & ~models.Q(status__in=["completed", "failed", "cancelled"]),
            ),
            # The lease sweep's orphan backstop (services.run_orphans_cancel): live child runs only.
            models.Index(
                fields=["parent"],
                name="run_child_live",
                condition=models.Q(parent__isnull=False) & ~models.Q(status__in=["completed", "failed", "cancelled"]),
            ),
            # Retention (apps.lifecycle.retention): ended top-level runs by age, across tenants and
            # per (tenant, agent); set once at the end, so step commits stay HOT.
            models.Index(fields=["completed_at"], name="run_retention_age", condition=_ENDED_ROOT),
            models.Index(
                fields=["tenant_id", "agent_name", "completed_at"], name="run_retention_agent", condition=_ENDED_ROOT
            ),
            # No-trace trees whose end did not delete them (a lost listener): beat's backstop.
            models.Index(
                fields=["completed_at"],
                name="run_no_trace_ended",
                condition=_ENDED_ROOT & models.Q(retention="no_trace"),
            ),
            # A user's run-state stream (apps.runs.userstream) reads the runs that ended since its last
            # poll. completed_at is set once, by the end's own (already non-HOT) update.
            models.Index(
                fields=["tenant_id", "user_id", "completed_at"],
                name="run_user_ended",
                condition=models.Q(completed_at__isnull=False),
            ),
            # The sweeper's look for parked runs with a cancel that had not landed (few or none).
            models.Index(
                fields=["status"],
                name="run_parked_cancel",
                condition=models.Q(cancel_requested=True, status__in=PARKED),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.agent_name} {self.status}"


class RunEvent(models.Model):
    # No separate run_id index: the (run, seq) unique index serves every lookup.
    # db_constraint=False: no FK trigger locking the run row per insert (module docstring).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False, db_constraint=False)
    seq = models.PositiveIntegerField()
    step = models.PositiveIntegerField(default=0)
    type = models.CharField(max_length=48)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    # The code version (settings.LOOMCYCLE.worker_version) of the worker whose iteration
    # appended this event: its claim (`started`) or its step commit. "" for events appended
    # outside an iteration (run creation, an answer, a cancel, input). A database default,
    # so code that predates the column (a worker still running during a rolling deploy)
    # inserts events without naming it (docs/operations.md, "Upgrades").
    worker_version = models.CharField(max_length=64, blank=True, default="", db_default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="runevent_run_seq")]
        ordering = ["run", "seq"]


class TranscriptEntry(models.Model):
    """One message or one tool result; never rewritten."""

    # db_constraint=False: no FK trigger locking the run row per insert (module docstring).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="transcript", db_index=False, db_constraint=False
    )
    idx = models.PositiveIntegerField()
    step = models.PositiveIntegerField()
    role = models.CharField(max_length=16)  # user | assistant
    content = models.JSONField()  # list of provider-neutral blocks
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "idx"], name="transcript_run_idx")]
        ordering = ["run", "idx"]


class RunInput(models.Model):
    """Steering / continuation text, drained at the top of the next iteration."""

    # db_constraint=False: no FK trigger locking the run row per insert (module docstring).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="inputs", db_constraint=False)
    text = models.TextField()
    source = models.CharField(max_length=16, default="api")
    created_at = models.DateTimeField(auto_now_add=True)
    consumed_step = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["run"], name="runinput_pending", condition=models.Q(consumed_step__isnull=True)),
        ]


class ToolCallRecord(models.Model):
    """Recorded as started before the tool runs; (run, step, call_id) is the
    idempotency key a redelivered iteration repeats."""

    # db_constraint=False: no FK trigger locking the run row per insert (module docstring).
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="tool_calls", db_index=False, db_constraint=False
    )
    step = models.PositiveIntegerField()
    call_id = models.CharField(max_length=128)
    name = models.CharField(max_length=128)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=ToolCallStatus.choices, default=ToolCallStatus.STARTED)
    is_error = models.BooleanField(default=False)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "step", "call_id"], name="toolcall_idempotency_key"),
        ]


class RuntimeState(models.Model):
    """Singleton row (id=1): the runtime-wide pause switch."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    state = models.CharField(max_length=16, choices=RuntimeStateValue.choices, default=RuntimeStateValue.RUNNING)
    updated_at = models.DateTimeField(auto_now=True)


class SignalOutbox(models.Model):
    """A lifecycle signal (apps.runs.signals) recorded in its transition's
    transaction and not yet delivered: inserted only when the signal has a
    receiver, deleted after its receivers ran. A row older than
    `LOOMCYCLE_SIGNAL_RESEND_SECONDS` was lost with its process (or is slow):
    the beat sweep sends it again. `claimed_at` is when a sweep last took it.
    Written only by apps.runs.store.outbox."""

    id = models.BigAutoField(primary_key=True)  # the receivers' `delivery_id`
    signal = models.CharField(max_length=32)  # run_created, run_parked, ... (apps.runs.signals.SIGNALS)
    run_id = models.CharField(max_length=32)
    kwargs = models.JSONField()  # the keyword arguments sent, without delivery_id
    created_at = models.DateTimeField(db_index=True)  # Postgres's clock, as the sweep compares it
    claimed_at = models.DateTimeField(null=True, blank=True)


class Interrupt(models.Model):
    """An Interruption.ask (SPEC 6.7, 9.6): a question to a human while its run is
    parked (`awaiting_interrupt`, no worker held). Inserted in the parked step's own
    commit, so it exists iff the run parked on it; leaves `pending` exactly once
    (resolved, declined, timed_out, cancelled) under its row lock, in the transaction
    that answers the run's parked call (apps.runs.wake.run_answer). Written only by
    apps.runs.store.interrupts."""

    id = models.CharField(primary_key=True, max_length=48)  # intr_<16hex ns><8hex>
    # db_constraint=False: inserted in the step commit that updates the run row (module docstring).
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="interrupts", db_constraint=False)
    call_id = models.CharField(max_length=128)  # the parked Interruption tool call it answers
    step = models.PositiveIntegerField()
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    user_id = models.CharField(max_length=128, default="", blank=True)
    agent_id = models.CharField(max_length=128)
    agent_name = models.CharField(max_length=128)
    kind = models.CharField(max_length=32, default="question")
    status = models.CharField(max_length=16, choices=InterruptStatus.choices, default=InterruptStatus.PENDING)
    question = models.TextField()
    options = models.JSONField(default=list, blank=True)  # [] = any answer
    context_data = models.JSONField(null=True, blank=True)
    priority = models.CharField(max_length=8, default="normal")  # low | normal | high
    answer = models.JSONField(null=True, blank=True)
    note = models.TextField(blank=True, default="")  # a decline's reason
    resolved_by = models.CharField(max_length=160, blank=True, default="")  # admin:<150-char username>
    created_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step", "call_id"], name="interrupt_run_call")]
        indexes = [
            # The user's inbox (GET /v1/users/{user_id}/interrupts).
            models.Index(fields=["tenant_id", "user_id", "status", "created_at"], name="interrupt_inbox"),
            # The expiry sweep scans pending rows only.
            models.Index(fields=["expires_at"], name="interrupt_pending_due", condition=models.Q(status="pending")),
        ]

    def __str__(self) -> str:
        return f"{self.id} {self.status} {self.question[:60]}"


class ResidentChild(models.Model):
    """A resident child (Agent op=open, SPEC 4.8): an interactive sub-run its parent
    drives turn by turn, parked at `awaiting_input` between turns. `waiter_call_id`
    is the parent's Agent call (open or send) parked until the child's turn ends;
    `read_idx` is the child's transcript index up to which the parent has read its
    output. Leaves `open` exactly once (closed by the parent, idle TTL, the parent's
    end, or the child run's own end). Written only by apps.runs.store.resident."""

    # db_constraint=False: inserted in the parent's step commit that updates the run row (module docstring).
    child = models.OneToOneField(
        Run, primary_key=True, on_delete=models.CASCADE, related_name="resident", db_constraint=False
    )
    parent = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="resident_children", db_constraint=False)
    tenant_id = models.CharField(max_length=128, default="", blank=True)
    agent_name = models.CharField(max_length=128)
    is_open = models.BooleanField(default=True)
    close_reason = models.CharField(max_length=256, blank=True, default="")
    idle_ttl_seconds = models.PositiveIntegerField()
    read_idx = models.PositiveIntegerField(default=0)
    waiter_call_id = models.CharField(max_length=128, blank=True, default="")  # "" = the parent waits for nothing
    waiter_until = models.DateTimeField(null=True, blank=True)  # the waiting call's timeout_ms deadline
    opened_at = models.DateTimeField()
    last_used_at = models.DateTimeField()  # the last open/send, or the end of the last turn
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # The per-parent cap and the parent's-end close count open rows of one parent.
            models.Index(fields=["parent"], name="resident_open_parent", condition=models.Q(is_open=True)),
            # beat's sweep scans open rows only.
            models.Index(fields=["last_used_at"], name="resident_open_used", condition=models.Q(is_open=True)),
        ]

    def __str__(self) -> str:
        return f"{self.child_id} of {self.parent_id} {'open' if self.is_open else 'closed'}"


from apps.runs.completion.models import RunWebhook as RunWebhook  # noqa: E402  (completion webhooks)
from apps.runs.completion.models import RunWebhookDelivery as RunWebhookDelivery  # noqa: E402
from apps.runs.fanout_models import FanOut as FanOut  # noqa: E402  (parallel_spawn and runs:batch joins)
from apps.runs.fanout_models import FanOutSlot as FanOutSlot  # noqa: E402
