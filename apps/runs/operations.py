"""Operator verbs of the run console (the Django admin), beside the API's in
apps.runs.services. Invariants:
- a retry re-opens only a `failed` top-level run, by compare-and-set on its
  status (store.retry_failed), at its last committed step: the transcript as
  committed is what the next iteration sends; its doorbell goes out on commit;
- a retry re-opens only its session's latest turn (409 `retry_not_latest_turn`
  otherwise: an older turn re-opened would answer out of order, after turns
  that already replayed its end), checked under the session's lock
  (store.session_lock), as every session decision is;
- a retried run takes a fairness slot again as run creation does (429 over
  cap), is admitted without the admission queue (an operator's act), and has
  no user credentials (they were erased when it failed);
- a bulk cancel is `run_cancel` once per live top-level run that matches.

There is no "requeue from step N" here: that is a fork of the run at that step
(apps.runs.fork, behind POST /v1/runs/{id}/fork and the admin's Fork button), a
new run in a new session.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction

from apps.core.errors import Conflict, Invalid, RuntimePaused
from apps.core.redact import runtime_redactor
from apps.core.types import Principal
from apps.gateway import fairness
from apps.runs import signals, store
from apps.runs.cancel import run_cancel
from apps.runs.dispatch import wake_and_enqueue
from apps.runs.models import RunStatus, RuntimeStateValue
from apps.runs.selectors import run_get, runs_live_top_level, runtime_state
from apps.runs.sessions.selectors import session_has_later_turn

BULK_CANCEL_MAX = 1000


def run_retry(*, principal: Principal, run_id: str) -> dict[str, Any]:
    """Re-open a failed top-level run at its last committed step and ring its doorbell."""
    run = run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    if run.status != RunStatus.FAILED:
        raise Conflict(f"run {run.id} is {run.status}: only a failed run can be retried", code="not_failed")
    if run.parent_id is not None:
        raise Conflict(f"run {run.id} is a sub-agent: its parent already has its result", code="retry_sub_agent")
    if run.notify_finished:
        raise Conflict(f"run {run.id} was started by a trigger that heard it end", code="retry_notified_run")
    if runtime_state() != RuntimeStateValue.RUNNING:
        raise RuntimePaused("runtime is paused; retry after resume")
    fairness.run_slot_take(run_id=run.id, tenant_id=run.tenant_id, user_id=run.user_id)  # 429 over cap
    reopened = None
    try:
        with transaction.atomic():
            store.session_lock(run.session_id)
            if session_has_later_turn(tenant_id=run.tenant_id, session_id=run.session_id, turn=run.session_turn):
                raise Conflict(
                    f"run {run.id} is turn {run.session_turn} of session {run.session_id}, which has later turns: "
                    "only a session's latest turn can be retried",
                    code="retry_not_latest_turn",
                )
            event = {"type": "retried", "by": principal.subject, "from_step": run.step}
            reopened = store.retry_failed(run_id=run.id, event=event, redactor=runtime_redactor())
            if reopened is None:  # another retry (or nothing) got there first
                raise Conflict(f"run {run.id} is no longer failed", code="not_failed")
            step, last_seq = reopened
            transaction.on_commit(lambda: wake_and_enqueue(run.id, last_seq, step))
            signals.send_on_commit(signals.run_resumed, run_id=run.id)
    except IntegrityError as exc:  # another run of its session is in flight (index run_session_live)
        reopened = None
        raise Conflict(f"run {run.id}'s session has a run in flight", code="session_busy") from exc
    finally:
        if reopened is None:
            fairness.run_slot_release(run.id)
    return {"retried": True, "run_id": run.id, "agent_id": run.agent_id, "step": reopened[0]}


@dataclass(frozen=True)
class BulkCancelled:
    cancelled: list[str]  # run ids whose cancel was taken
    already_done: list[str]  # run ids that had ended meanwhile


def runs_cancel_matching(*, principal: Principal, tenant_id: str | None, agent_name: str, reason: str) -> BulkCancelled:
    """Cancel every live top-level run of `tenant_id` (None: every tenant the
    principal reads) and/or agent `agent_name` ("" = any), at most
    BULK_CANCEL_MAX, each through run_cancel (its descendants cascade).
    One of the two must narrow: "cancel everything" is the runtime pause."""
    if tenant_id is None and not agent_name:
        raise Invalid("name a tenant or an agent (or both)", code="bulk_cancel_unscoped")
    tenant = tenant_id if principal.read_tenant is None else principal.read_tenant  # a tenant reaches only its own
    owner = principal.read_user
    runs = runs_live_top_level(tenant_id=tenant, agent_name=agent_name, owner=owner, limit=BULK_CANCEL_MAX)
    done: list[str] = []
    gone: list[str] = []
    for run_id in runs:
        out = run_cancel(principal=principal, run_id=run_id, reason=reason)
        (done if out["cancelled"] else gone).append(run_id)
    return BulkCancelled(cancelled=done, already_done=gone)
