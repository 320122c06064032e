"""The step's one fenced commit (with the children, waits and signal outbox rows it carries) and the
after-commit work: doorbells, post-park checks, a resident turn's report, the run's end
(apps.runs.lifecycle)."""

from __future__ import annotations

import logging
from functools import partial

from django.db import connection, transaction

from apps.core.redact import run_redactor
from apps.runs import signals, statebus, store
from apps.runs.children import resident
from apps.runs.children.spawn import children_enqueue, children_insert, spawns_abandon
from apps.runs.completion import services as completion
from apps.runs.completion.spec import EVENTS as WEBHOOK_EVENTS
from apps.runs.dispatch import wake_and_enqueue
from apps.runs.engine import budget
from apps.runs.engine.write import Next, StepWrite
from apps.runs.lifecycle import Ended, run_ended
from apps.runs.models import Run, RunStatus
from apps.runs.store import ClaimedRun, StepRows

log = logging.getLogger("loomcycle.engine")


def commit_write(run: ClaimedRun, write: StepWrite) -> str | None:
    """The committed status (store.commit_step), None when the fence was lost."""
    rows = StepRows(
        transcript=write.transcript,
        events=write.events,
        consumed_inputs=write.consumed_inputs,
        finished_calls=write.finished_calls,
        tool_batch=write.tool_batch,
        tools_started_at=write.tools_started_at,
        ledger=write.ledger,
    )
    commit = partial(
        store.commit_step,
        run=run,
        status=write.status,
        advance=write.advance,
        finish=write.next == Next.FINISH,
        requeue=write.next == Next.REQUEUE,
        stop_reason=write.stop_reason,
        error=write.error,
        usage=write.usage,
        rows=rows,
        pending_calls=len(write.spawns) + len(write.parks),
        switched=write.switched,
        redactor=run_redactor(run.credentials),
    )
    try:
        if not write.spawns and not write.parks and not _signalled(write) and not _announced(run, write):
            return _armed(run, write, commit())  # one autocommit statement: the hot path when no signal has a receiver
        # Children, waits and the signals' outbox rows exist iff the parent's fenced step commits.
        with transaction.atomic():
            status = _armed(run, write, commit())
            if status != write.status:  # fence lost, or a cancel turned the park into a doorbell
                spawns_abandon(write.spawns, [park for _, park in write.parks])
                write.spawns, write.parks = [], []
            if write.spawns:
                write.child_ids = children_insert(
                    parent_id=run.id, tenant_id=run.tenant_id, user_id=run.user_id, depth=run.depth, spawns=write.spawns
                )
            for call_id, park in write.parks:
                park.record(run.id, run.step, call_id)
            if status is not None:
                write.deliveries = _record_signals(run, write, final=status == write.status)
            if status == write.status and _announced(run, write):  # its webhook's delivery row (apps.runs.completion)
                completion.record_in_commit(run_id=run.id, event=status)
            return status
    finally:
        connection.close()


def _armed(run: ClaimedRun, write: StepWrite, committed: tuple[str, bool] | None) -> str | None:
    """The committed status; `write.armed` set to the token the next doorbell carries
    when the commit armed the next step's lease (store.commit_step)."""
    if committed is None:
        return None
    status, armed = committed
    write.armed = run.lease_token + 1 if armed else None
    return status


def after_commit(run: ClaimedRun, write: StepWrite) -> None:
    committed = RunStatus.RUNNING if write.next == Next.REQUEUE else write.status
    if committed != run.status:  # a park or an end: the user's run-state streams hear it (apps.runs.statebus)
        statebus.announce(tenant_id=run.tenant_id, user_id=run.user_id, run_id=run.id, status=committed)
    budget.settle(run, write)  # the step's spend reaches its budgets before anything can start the next
    wake_and_enqueue(
        run.id,
        run.last_seq + len(write.events) if write.events else None,
        run.step + int(write.advance) if write.next == Next.REQUEUE else None,
        write.armed,
    )
    children_enqueue(write.child_ids)
    for call_id, park in write.parks:
        try:
            park.after_commit(run.id, call_id)
        except Exception:  # the wait row is committed: the beat sweep answers it
            log.exception("run %s call %s: the post-park check failed; the wake sweep will answer it", run.id, call_id)
        finally:
            connection.close()
    _resident_turn_ended(run, write)
    if write.next == Next.FINISH:  # the run's end: every after-effect, as a cancel's (apps.runs.lifecycle)
        # A cancelled end is always announced: the claim's copy of notify_finished predates a
        # cancel that set it (DELETE ?cancel=true marks the tree no-trace, then cancels it).
        announce = run.notify_finished or write.status == RunStatus.CANCELLED
        ended = Ended(run.id, write.status, run.parent_id, announce, tuple(run.tools))
        run_ended(ended, close_connection=True)
    # Last: the deployment's receivers never delay or abort the runtime's own after-commit work.
    signals.deliver_all(write.deliveries, close_connection=True)


def _resident_turn_ended(run: ClaimedRun, write: StepWrite) -> None:
    """A resident child's turn ended (its parent's waiting call is answered: apps.runs.children.resident).
    Other runs pay nothing; a run's end closes its resident rows through apps.runs.lifecycle."""
    if not (run.parent_id and write.next == Next.PARK and write.status == RunStatus.AWAITING_INPUT):
        return
    try:
        resident.resident_turn_ended(child_id=run.id)
    finally:
        connection.close()


def _signalled(write: StepWrite) -> bool:
    """Whether this step may send a lifecycle signal that has a receiver (then its commit is a transaction
    holding the outbox rows). A spawning step is a transaction anyway; no receiver: False, no query."""
    return (
        (signals.tool_called.has_listeners(Run) and any(e.get("type") == "tool_result" for e in write.events))
        or (write.next == Next.PARK and signals.run_parked.has_listeners(Run))
        or (write.next == Next.FINISH and signals.run_finished.has_listeners(Run))
    )


def _announced(run: ClaimedRun, write: StepWrite) -> bool:
    """Whether this step's end or park may be a completion webhook's event: only a `notify_finished`
    run (every run with a webhook is one) pays for the check, a no-op INSERT ... SELECT without one."""
    return run.notify_finished and write.next in (Next.FINISH, Next.PARK) and write.status in WEBHOOK_EVENTS


def _record_signals(run: ClaimedRun, write: StepWrite, *, final: bool) -> list[signals.Delivery]:
    """The outbox rows of this step's lifecycle signals (apps.runs.signals), inside the step's transaction;
    only those with a receiver. `final`: the step committed the status it meant (not a park or finish
    turned into a doorbell), so its park or finish is signalled."""
    recorded: list[signals.Delivery | None] = []
    for event in write.events:
        if event.get("type") == "tool_result":
            use = event["tool_use"]
            recorded.append(
                signals.record(
                    signals.tool_called, run_id=run.id, call_id=use["id"], tool=use["name"], is_error=event["is_error"]
                )
            )
    for child_id in write.child_ids:
        recorded.append(
            signals.record(
                signals.run_created, run_id=child_id, tenant_id=run.tenant_id, user_id=run.user_id, parent_id=run.id
            )
        )
    if final and write.next == Next.PARK:
        recorded.append(signals.record(signals.run_parked, run_id=run.id, status=write.status))
    elif final and write.next == Next.FINISH:
        recorded.append(signals.record(signals.run_finished, run_id=run.id, status=write.status))
    return [delivery for delivery in recorded if delivery is not None]
