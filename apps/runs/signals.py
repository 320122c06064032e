"""Django signals for the run lifecycle, for the deployment's own Python code (docs/extending.md).

Each is sent with `sender=Run` and keyword arguments only, after the transaction
that recorded the transition commits, in the process that committed it: the web
process for creations, cancels and steering, a worker for everything the engine
does. Besides the kwargs each signal lists, every send carries `delivery_id`
(an int, the outbox row's id): the same id on a re-send of the same transition.

Delivery is AT LEAST ONCE per transition. When a signal has a receiver in the
committing process, the transition's own transaction inserts an outbox row
(`runs_signaloutbox`: signal name, kwargs, run id, created_at); after the commit
the receivers run, then the row is deleted (send first, then delete: a crash
between the two re-sends, never loses). A row older than
`LOOMCYCLE_SIGNAL_RESEND_SECONDS` (its process died between the commit and the
delete, or its receivers are still running) is claimed by the beat sweep
(`resend_due`, from the lease sweep task) with `FOR UPDATE SKIP LOCKED`, sent
in the sweeping worker with the same `delivery_id`, and deleted. So a receiver
may see one transition twice (after a crash, or when a send outlasts the
grace), must be idempotent (dedupe on `delivery_id`), and must not rely on order
across runs (a re-sent signal arrives after later ones).

A receiver that raises is logged with its exception and changes nothing: the
transition is already committed, the other receivers still run, and the row is
deleted all the same (a receiver's failure is not the runtime's to retry; a
receiver that needs retries records its work and retries it itself). A row whose
signal has no receiver in the sweeping process (its app was removed from that
process) is deleted with a warning, not retried forever. Receivers run on the
committing thread, outside any transaction: keep them short (they delay the
run's next step on a worker) and put slow work on your own queue.

A signal with no receiver costs nothing: no outbox row, no extra query, no
transaction the engine would not otherwise open.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.dispatch import Signal

from apps.runs import store
from apps.runs.models import Run

log = logging.getLogger("loomcycle.runs.signals")

run_created = Signal()
"""A run was created (a sub-agent too). kwargs: run_id, tenant_id, user_id, parent_id (None: top-level)."""

run_parked = Signal()
"""A worker parked the run (no worker waits for it). kwargs: run_id, status (awaiting_input,
waiting_children, waiting_channel, paused, ...)."""

run_resumed = Signal()
"""A parked run was woken: its last pending call was answered, steering text arrived for an
awaiting run, or the runtime resumed. kwargs: run_id."""

run_finished = Signal()
"""The run reached a terminal status. kwargs: run_id, status (completed, failed, cancelled)."""

tool_called = Signal()
"""A tool call's result was committed (at the worker's step, or when a parked call was answered).
kwargs: run_id, call_id, tool, is_error. The input and result text are not sent: read the run's
events (stored redacted) if a receiver needs them."""

interruption_pending = Signal()
"""An Interruption.ask parked its run (the parked step committed). kwargs: run_id, tenant_id,
user_id, agent_id, agent (its name), interruption (the `interruption_pending` event's object:
interrupt_id, kind, question, options, context, priority, expires_at). apps.channels publishes it
to `_system/interrupts/pending` when that channel is declared."""

interruption_resolved = Signal()
"""An interrupt left `pending` (answered, declined, timed out, or cancelled because its run ended).
kwargs: run_id, tenant_id, user_id, agent (its name), interrupt_id, status, resolved_by, resolved_at. apps.channels
publishes it to `_system/interrupts/resolved` when that channel is declared."""

SIGNALS: dict[str, Signal] = {
    "run_created": run_created,
    "run_parked": run_parked,
    "run_resumed": run_resumed,
    "run_finished": run_finished,
    "tool_called": tool_called,
    "interruption_pending": interruption_pending,
    "interruption_resolved": interruption_resolved,
}
"""The outbox's `signal` column names one of these."""

RESEND_BATCH = 500
"""Rows one sweep claims at most; the rest wait for the next sweep."""


@dataclass(frozen=True)
class Delivery:
    """A signal recorded in the outbox (row `delivery_id`) and not yet sent."""

    signal: Signal
    delivery_id: int
    kwargs: dict[str, Any]


def listening() -> bool:
    """Whether any lifecycle signal has a receiver in this process (the engine opens a transaction only then)."""
    return any(signal.has_listeners(Run) for signal in SIGNALS.values())


def atomic_if_listened(signal: Signal) -> contextlib.AbstractContextManager[Any]:
    """A transaction (joining the caller's, without a savepoint) when `signal` has a receiver, so its
    outbox row commits with the transition; nothing otherwise (the unlistened path stays as it was)."""
    return transaction.atomic(savepoint=False) if signal.has_listeners(Run) else contextlib.nullcontext()


def record(signal: Signal, **kwargs: Any) -> Delivery | None:
    """Insert `signal`'s outbox row in the current transaction; None (nothing written) without a receiver.
    `kwargs` must be JSON values and name the run (`run_id`)."""
    if not signal.has_listeners(Run):
        return None
    name = next(n for n, s in SIGNALS.items() if s is signal)
    delivery_id = store.outbox_insert(signal=name, run_id=kwargs["run_id"], kwargs=kwargs)
    return Delivery(signal, delivery_id, kwargs)


def send_on_commit(signal: Signal, **kwargs: Any) -> None:
    """Record `signal` in the outbox and send it after the current transaction commits; nothing if no receiver.
    Call it inside the transition's transaction: outside one (autocommit) the transition has already
    committed, so the row, committed at once, covers only a crash during the send itself. The caller's
    connection is left open (in the web process it is the request's)."""
    delivery = record(signal, **kwargs)
    if delivery is not None:
        transaction.on_commit(lambda: deliver(delivery))


def deliver(delivery: Delivery, *, close_connection: bool = False) -> None:
    """Every receiver runs (one that raises is logged with its exception, the others still run), then the
    row is deleted. Never raises: a failure of the send or the delete is logged, and the sweep re-sends
    the row after the grace. `close_connection`: the engine and the sweep hand the thread's connection
    back afterwards (a receiver's queries open it), as they do after their own work; elsewhere (the web
    process) the connection belongs to the caller and stays open."""
    kwargs = {**delivery.kwargs, "delivery_id": delivery.delivery_id}
    try:
        for receiver, result in delivery.signal.send_robust(sender=Run, **kwargs):
            if isinstance(result, Exception):
                log.error(
                    "receiver %s of a run signal failed (run %s, delivery %s); not retried",
                    getattr(receiver, "__qualname__", receiver),
                    kwargs.get("run_id"),
                    delivery.delivery_id,
                    exc_info=result,
                )
        _delete(delivery.delivery_id)
    except Exception:  # after the commit: nothing to undo; the outbox row stays for the sweep
        run_id = kwargs.get("run_id")
        log.exception("signal delivery %s (run %s) failed; the sweep will re-send it", delivery.delivery_id, run_id)
    finally:
        if close_connection and not connection.in_atomic_block:
            connection.close()


def deliver_all(deliveries: list[Delivery], *, close_connection: bool = False) -> None:
    for delivery in deliveries:
        deliver(delivery, close_connection=close_connection)


def _delete(delivery_id: int) -> None:
    try:
        store.outbox_delete(delivery_id=delivery_id)
    except DatabaseError:  # the receivers ran; the sweep sends it again (at least once, not exactly once)
        log.exception("signal outbox row %s not deleted after its send; the sweep will re-send it", delivery_id)


def resend_due() -> int:
    """Beat: send again the outbox rows older than the grace (their process died before deleting them,
    or is still sending), in this process, then delete them. Rows of a signal with no receiver here
    are deleted with a warning. Returns the rows claimed."""
    grace = settings.LOOMCYCLE.signal_resend_seconds
    claimed = store.outbox_claim_due(grace_seconds=grace, limit=RESEND_BATCH)
    for delivery_id, name, kwargs in claimed:
        signal = SIGNALS.get(name)
        if signal is None or not signal.has_listeners(Run):
            log.warning(
                "signal outbox row %s (%s, run %s): no receiver in this process; deleted unsent",
                delivery_id,
                name,
                kwargs.get("run_id"),
            )
            _delete(delivery_id)
            continue
        log.info("re-sending %s of run %s (delivery %s)", name, kwargs.get("run_id"), delivery_id)
        deliver(Delivery(signal, delivery_id, kwargs), close_connection=True)
    return len(claimed)
