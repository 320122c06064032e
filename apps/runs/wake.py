"""Answering a parked tool call, and waking the run: the one service through
which sub-agents and channels resume a parked run (`run_answer`).

Invariants:
- Called inside the answerer's transaction, so the answer (transcript row,
  events, the finished tool-call record) and whatever produced it (a child's
  report flag, a channel cursor, the deleted wait row) commit together.
- The run row is locked first: answers to one run are serialised, and the
  answer's rows take their seq/idx from the run row their own UPDATE
  advances (apps.runs.store's append primitive), so they stay consecutive.
- Exactly the answer that brings `pending_calls` to zero flips the run from
  its parked status back to `running` (a conditional UPDATE) and rings its
  doorbell after the commit. A run that ended meanwhile (cancelled) is left
  alone and the answer is dropped.

Runs waiting for an admission slot (`waiting_slot`, apps.runs.backpressure)
are woken here too, by `runs_admit_waiting`, when a top-level run ends
(apps.runs.lifecycle) and by beat as a backstop.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from django.db import transaction

from apps.runs import backpressure, signals, statebus, store, tracing
from apps.runs.dispatch import enqueue_iteration, notify_events, wake_and_enqueue
from apps.runs.statuses import ANSWERABLE as ANSWERABLE
from apps.runs.statuses import RunStatus

log = logging.getLogger("loomcycle.runs")


def run_answer(
    *,
    run_id: str,
    call_id: str,
    tool_name: str,
    text: str,
    is_error: bool,
    events: tuple[dict[str, Any], ...] = (),
) -> bool:
    """Append the result of parked call `call_id` (plus `events` before it) and
    wake the run if it was the last pending call. Must run inside a
    transaction. False when nothing was written: the run is already terminal,
    or waits for no call (a stray answer is dropped, never counted)."""
    target = store.answer_lock(run_id=run_id, call_id=call_id)
    if target is None:
        return False
    tool_use = {"id": call_id, "name": tool_name, "input": target.call_input}
    payloads = [*events, {"type": "tool_result", "tool_use": tool_use, "text": text, "is_error": is_error}]
    block = {"type": "tool_result", "tool_use_id": call_id, "content": text, "is_error": is_error}
    woke, seq = store.answer_append(run_id=run_id, target=target, events=payloads, block=block, is_error=is_error)
    transaction.on_commit(lambda: notify_events(run_id, seq))
    signals.send_on_commit(signals.tool_called, run_id=run_id, call_id=call_id, tool=tool_name, is_error=is_error)
    # Exactly the last answer flips the run back to running (pending_calls was 1 under the row lock).
    if woke:
        ring = partial(enqueue_iteration, run_id, target.run_step)
        transaction.on_commit(lambda: tracing.woken(target.trace_context, run_id=run_id, reason="answer", ring=ring))
        signals.send_on_commit(signals.run_resumed, run_id=run_id)
        tenant_id, user_id = target.owner
        statebus.announce_on_commit(tenant_id=tenant_id, user_id=user_id, run_id=run_id, status=RunStatus.RUNNING)
    return True


def ring_promoted(promoted: list[backpressure.Promoted]) -> None:
    """After the promotion committed: each run's doorbell and its stream readers."""
    for p in promoted:
        wake_and_enqueue(p.run_id, p.last_seq, p.step)


def runs_admit_waiting() -> int:
    """Move waiting runs into free admission slots (oldest first) and ring
    their doorbells after that commit. Beat calls it too, as the backstop for a
    promotion lost with its process (or a cap raised or turned off)."""
    promoted = backpressure.promote_waiting()
    ring_promoted(promoted)
    if promoted:
        log.info("admission: %d waiting run(s) started", len(promoted))
    return len(promoted)


def runs_wake_budget(*, tenant_id: str, user_id: str, agent: str) -> int:
    """Wake the runs parked `waiting_budget` for this spender (apps.budgets decides the budget
    has freed: its window reset, or its limit was raised or deleted). Exactly once per park:
    the conditional UPDATE in apps.runs.store.budget; doorbells after the commit."""
    with transaction.atomic():
        woken = store.budget_waiting_wake(tenant_id=tenant_id, user_id=user_id, agent=agent)
        for run_id, step in woken:
            transaction.on_commit(partial(enqueue_iteration, run_id, step))
            signals.send_on_commit(signals.run_resumed, run_id=run_id)
    return len(woken)


def budget_waiting_spenders() -> list[tuple[str, str, str, int]]:
    """(tenant, user, agent, runs) waiting for a budget: what apps.budgets re-checks."""
    return store.budget_waiting_spenders()
