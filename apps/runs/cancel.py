"""Cancelling runs: a caller's cancel, the runtime's stop, the cancel of a tree, and the
finish of a run that no worker holds. Invariants:
- the root of a tree is flagged before its descendants are read (a child inserted
  meanwhile is read, or inserted under a flagged parent);
- a run that holds a lease is only flagged and signalled: its worker finishes it; a run
  no worker holds is finished here, in one transaction with its `done` event (a lease its
  step commit armed is held by no worker until an adopter's heartbeat names it the owner:
  such a run is finished here, and signalled too, for an adopter that has not beaten yet);
- a finished run's after-effects are apps.runs.lifecycle.run_ended, as for a run its
  worker finished; the deployment's run_finished receivers run once the whole tree is
  finished or signalled.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from django.db import transaction

from apps.core.redact import Redactor, runtime_redactor
from apps.core.types import Principal
from apps.runs import lifecycle, signals, statebus, store
from apps.runs.completion import services as completion
from apps.runs.credentials import run_redactor_of
from apps.runs.dispatch import notify_events
from apps.runs.live import publish_cancel
from apps.runs.models import PARKED, TERMINAL, Run, RunStatus
from apps.runs.selectors import run_get, runs_orphaned

log = logging.getLogger("loomcycle.runs")


def _live_descendants(run: Run) -> list[Run]:
    """Breadth-first over children that are not terminal."""
    found: list[Run] = []
    frontier = [run.id]
    while frontier:
        kids = list(Run.objects.filter(parent_id__in=frontier).exclude(status__in=TERMINAL))
        found.extend(kids)
        frontier = [k.id for k in kids]
    return found


def run_cancel(
    *, principal: Principal, agent_id: str | None = None, run_id: str | None = None, reason: str = ""
) -> dict[str, Any]:
    """Cancel a run (by `agent_id`, else `run_id`) and its live descendants. Idempotent on terminal runs."""
    run = run_get(tenant_id=principal.read_tenant, agent_id=agent_id, run_id=run_id, owner=principal.read_user)
    if run.status in TERMINAL:
        return {"cancelled": False, "agent_id": run.agent_id, "status": run.status}
    reason = reason or "cancelled by api"
    descendants = _cancel_tree(run, reason)
    return {
        "cancelled": True,
        "agent_id": run.agent_id,
        "cascaded": [d.agent_id for d in descendants],
        "reason": reason,
    }


def run_stop(*, run_id: str, reason: str) -> bool:
    """Cancel a run and its live descendants for the runtime itself, with no caller to
    check (a resident child closed by its parent, its idle TTL or its parent's end).
    False when the run had ended already."""
    run = Run.objects.filter(id=run_id).first()
    if run is None or run.status in TERMINAL:
        return False
    _cancel_tree(run, reason)
    return True


def _cancel_tree(run: Run, reason: str) -> list[Run]:
    """Finish (or signal the lease holder of) `run` and its live descendants; the descendants.
    The root is flagged BEFORE its descendants are read: a child inserted by a park that commits
    meanwhile is either read here or inserted under a flagged parent (which starts no more
    waiting siblings). What a crash mid-way leaves, the lease sweep's orphan backstop ends
    (run_orphans_cancel)."""
    # Descendants hold the parent's credentials or fewer (apps.runs.children.spawn): its redactor covers them.
    redactor = run_redactor_of(run_id=run.id, sealed=run.credentials_sealed)
    finished: list[signals.Delivery] = []
    _finish_announced(run, reason, redactor, finished)
    descendants = _live_descendants(run)
    for target in descendants:
        _finish_announced(target, "parent run cancelled", redactor, finished)
    # Every run of the tree: the worker holding a leased one finishes it; one finished here may
    # have an adopter that has not beaten yet (its commit is fenced out; this stops its calls).
    publish_cancel([run.id, *(d.id for d in descendants)])
    # The deployment's run_finished receivers run after every run of the tree is finished or signalled.
    transaction.on_commit(lambda: signals.deliver_all(finished))
    return descendants


def _finish_announced(run: Run, reason: str, redactor: Redactor, finished: list[signals.Delivery]) -> bool:
    """_finish_unleased, and its end announced to the user's run-state streams (apps.runs.statebus)."""
    done = _finish_unleased(_ended_of(run), reason, redactor, finished)
    if done:
        statebus.announce_on_commit(
            tenant_id=run.tenant_id, user_id=run.user_id, run_id=run.id, status=RunStatus.CANCELLED
        )
    return done


def _finish_unleased(run: lifecycle.Ended, reason: str, redactor: Redactor, finished: list[signals.Delivery]) -> bool:
    """Set the cancel flag; finish the run here if no worker holds a lease, its end's after-effects
    on commit (apps.runs.lifecycle.run_ended, `run` says what its row is). Its run_finished outbox row
    (with a receiver) is appended to `finished`, for the caller to deliver once the whole tree is done."""
    with transaction.atomic():
        seq = store.cancel(run_id=run.run_id, reason=reason, redactor=redactor)
        if seq is None:
            return False
        transaction.on_commit(lambda: notify_events(run.run_id, seq))
        transaction.on_commit(lambda: lifecycle.run_ended(run))
        if run.notify_finished:  # its webhook's delivery row, with the end (apps.runs.completion)
            completion.record_in_commit(run_id=run.run_id, event=RunStatus.CANCELLED)
        delivery = signals.record(signals.run_finished, run_id=run.run_id, status=RunStatus.CANCELLED)
    if delivery is not None:
        finished.append(delivery)
    return True


def _cancelled(
    run_id: str, parent_id: str | None, notify_finished: bool, tools: Sequence[str] | None
) -> lifecycle.Ended:
    """The end a cancel gives the run whose row has these columns."""
    return lifecycle.Ended(
        run_id=run_id,
        status=RunStatus.CANCELLED,
        parent_id=parent_id,
        notify_finished=notify_finished,
        tools=tuple(tools or ()),
    )


def _ended_of(run: Run) -> lifecycle.Ended:
    return _cancelled(run.id, run.parent_id, run.notify_finished, run.tools)


def run_parked_cancels_finish() -> int:
    """Finish parked runs whose cancel flag is set: a cancel meant for a worker
    that then parked the run (the step commit turns such parks into doorbells;
    this sweep finishes any that got through, e.g. parked before that fix)."""
    parked = Run.objects.filter(status__in=PARKED, cancel_requested=True)  # index run_parked_cancel
    deliveries: list[signals.Delivery] = []
    rows = parked.values_list("id", "parent_id", "notify_finished", "tools", "cancel_reason")[:1000]
    finished = sum(
        # the reason was stored redacted already
        _finish_unleased(_cancelled(*row[:4]), row[4], runtime_redactor(), deliveries)
        for row in rows
    )
    signals.deliver_all(deliveries, close_connection=True)  # a sweep, in a worker
    if finished:
        log.info("sweeper finished %d parked run(s) whose cancel had not landed", finished)
    return finished


ORPHAN_BATCH = 200


def run_orphans_cancel() -> int:
    """Beat backstop: cancel (with what they spawned) live runs whose parent has ended: children a
    park inserted while its parent's cancel read its tree, `waiting_fanout` children of an ended
    parent, what a crash in the middle of a cascade left. Bounded per sweep; the count cancelled."""
    done = sum(run_stop(run_id=run_id, reason="parent run ended") for run_id in runs_orphaned(limit=ORPHAN_BATCH))
    if done:
        log.warning("sweeper cancelled %d run(s) whose parent had ended", done)
    return done
