"""A run ended: the one after-commit fan-out of its end (`run_ended`), whoever ended it.

A run ends in two places: its worker's final step commit (the engine: completed, failed, or
cancelled at its claim or during its step) and a cancel of a run no worker holds
(apps.runs.cancel: an API or operator cancel, the cascade down its tree, the parked-cancel
sweep, the orphan sweep). Both call `run_ended` once the end has committed, with what the
end's own row says (`Ended`), and both therefore give the same after-effects under the
same conditions, listed here and nowhere else:

- listeners registered with `on_run_finished` (apps.triggers' on_complete hooks, apps.tools'
  ephemeral volumes, the runs:batch join), for a run created with `notify_finished` only;
- the run's fairness slot (apps.gateway.fairness) is given back: EVERY run holds one, a
  sub-agent too (taken by apps.runs.children.spawn before its parent's commit);
- the wings' subscribers, each under its own condition (`subscribe`, at RunsConfig.ready):
  a resident child's row closes, or a run's resident children are closed, for a child or a
  run that may have opened any (`may_hold_residents`: it has the Agent tool); a child reports
  to its parent (`is_child`); the session's next enqueued run starts (`is_top_level`);
- the admission queue moves on (apps.runs.backpressure), for a top-level run only.

Why these conditions: only top-level runs are admitted (sub-agents share their root's
admission slot: backpressure admits trees) and only top-level runs belong to a session, so a
child's end frees neither; the engine has always skipped both for a child, and the cancel
path's call for a child was a recount that found nothing to promote. A child reports when
it has a parent; a runs:batch child is a top-level `notify_finished` run and reports to its
join through its finish listener. The conditions read the row (`parent_id`, `tools`,
`notify_finished`), never a query, so a plain top-level run's end costs no read for the
wings it does not concern.

None of these is lost with a process: each has a beat backstop (children_report_sweep,
resident_sweep, sessions_promote_sweep, runs_admission_sweep, triggers-finished-sweep, the
fairness reconcile). The deployment's Django signal `run_finished` (apps.runs.signals) is an
outbox delivery its committing transaction recorded, delivered by the caller after this.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.db import DatabaseError, connection

from apps.gateway import fairness
from apps.runs import backpressure, wake

log = logging.getLogger("loomcycle.runs")


@dataclass(frozen=True)
class Ended:
    """What a run's end says of it: its row's columns at its terminal commit."""

    run_id: str
    status: str
    parent_id: str | None = None
    notify_finished: bool = False
    tools: Sequence[str] = ()


Condition = Callable[[Ended], bool]
Subscriber = Callable[[Ended], None]


def is_child(ended: Ended) -> bool:
    """A sub-agent: it reports to its parent."""
    return ended.parent_id is not None


def is_top_level(ended: Ended) -> bool:
    """A top-level run: it held an admission slot and a session's turn."""
    return ended.parent_id is None


def may_hold_residents(ended: Ended) -> bool:
    """A run that is or may have opened a resident child (apps.runs.children.resident)."""
    return ended.parent_id is not None or "Agent" in ended.tools


_SUBSCRIBERS: list[tuple[Subscriber, Condition]] = []


def subscribe(subscriber: Subscriber, *, when: Condition) -> None:
    """Call `subscriber(ended)` after the end of every run that `when` accepts (use this
    module's conditions). Wings subscribe at RunsConfig.ready(), in the order they run.
    Idempotent: ready() may run more than once in a process (tests)."""
    if all(s is not subscriber for s, _ in _SUBSCRIBERS):
        _SUBSCRIBERS.append((subscriber, when))


def run_ended(ended: Ended, *, close_connection: bool = False) -> None:
    """After the run's end committed: every after-effect of it, in this order (see the
    module's docstring). `close_connection`: hand the thread's database connection back
    after each step (a worker's iteration; a web request keeps its own)."""
    steps: list[Callable[[], None]] = []
    if ended.notify_finished:
        steps.append(lambda: run_finished(ended.run_id, ended.status))
    steps.append(lambda: fairness.run_slot_release(ended.run_id))
    steps += [_bind(s, ended) for s, when in list(_SUBSCRIBERS) if when(ended)]
    if is_top_level(ended):
        steps.append(lambda: _admission_moves_on(ended.run_id))
    for step in steps:
        try:
            step()
        finally:
            if close_connection:
                connection.close()


def _bind(subscriber: Subscriber, ended: Ended) -> Callable[[], None]:
    return lambda: subscriber(ended)


def _admission_moves_on(run_id: str) -> None:
    """A top-level run's admission slot is free: the oldest waiting runs start. A no-op with
    `max_concurrent_runs` off (beat still promotes leftovers). A database error is logged: the
    end is committed, and beat's admission sweep promotes within a sweep period."""
    if backpressure.limits().max_concurrent_runs <= 0:
        return
    try:
        wake.runs_admit_waiting()
    except DatabaseError:
        log.exception("run %s ended; promoting waiting runs failed, the admission sweep will", run_id)


# --- "run finished" listeners ------------------------------------------------------------
# Apps that want to hear when a run ends (apps.triggers' on_complete hooks; apps.tools purges
# a top-level run's ephemeral volumes) register here from AppConfig.ready(), as tools do: the
# engine never imports them. Only runs created with `notify_finished` are announced (a
# trigger's run, a top-level run with an ephemeral volume), so other runs pay nothing for it.

RunFinished = Callable[[str, str], None]  # (run_id, terminal status)
_FINISHED: list[RunFinished] = []


def on_run_finished(listener: RunFinished) -> None:
    """Call `listener(run_id, status)` after a notify_finished run's end commits (at most once
    per run from its worker or its cancel; a listener must itself tolerate a second call)."""
    if listener not in _FINISHED:
        _FINISHED.append(listener)


def run_finished(run_id: str, status: str) -> None:
    """Tell every listener; one listener's failure is logged and does not stop the others."""
    for listener in list(_FINISHED):
        try:
            listener(run_id, status)
        except Exception:  # a listener's bug must not fail the run's (committed) end
            log.exception(
                "run %s: a run-finished listener (%s) failed", run_id, getattr(listener, "__name__", listener)
            )
