"""Django signals for the run lifecycle, for the deployment's own Python code (docs/extending.md).

Each is sent with `sender=Run` and keyword arguments only, after the transaction
that recorded the transition commits (`transaction.on_commit`; at once when no
transaction is open), in the process that committed it: the web process for
creations, cancels and steering, a worker for everything the engine does.

Delivery is AT MOST ONCE per transition: the send is an in-memory callback after
the commit, so a process that dies between its commit and the send loses that
signal, and nothing re-sends it (there is no outbox). A receiver that needs every
transition reads the run's durable state (its status, its events) to catch up.
Receivers run synchronously on the committing thread, after the commit: a
receiver that raises is logged with its exception and changes nothing (the
transition is already committed; the other receivers still run). Keep them short
(they delay the run's next step on a worker) and put slow work on your own queue.

A signal with no receiver costs nothing: it is not even scheduled.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import connection, transaction
from django.dispatch import Signal

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


def send_on_commit(signal: Signal, **kwargs: Any) -> None:
    """Send `signal` after the current transaction commits (at once outside one); nothing if no receiver."""
    if not signal.has_listeners(Run):
        return
    transaction.on_commit(lambda: _send(signal, kwargs))


def _send(signal: Signal, kwargs: dict[str, Any]) -> None:
    """Every receiver runs; one that raises is logged with its exception, and the others still run."""
    try:
        for receiver, result in signal.send_robust(sender=Run, **kwargs):
            if isinstance(result, Exception):
                log.error(
                    "receiver %s of a run signal failed (run %s)",
                    getattr(receiver, "__qualname__", receiver),
                    kwargs.get("run_id"),
                    exc_info=result,
                )
    finally:
        if not connection.in_atomic_block:
            connection.close()  # a receiver's queries hand their connection back, as the engine's own do
