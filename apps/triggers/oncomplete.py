"""`on_complete` hooks of a trigger's run (SPEC 9.1): `channel.publish` and
`memory.set`, in order, only when the run ends `completed`. Generic: any
trigger (schedules now, webhooks later) records the hooks with
`oncomplete_record` in the transaction that creates its run (created with
`notify_finished`), and `oncomplete_run` runs them when the run ends: in the
hooks' own Celery task for a completed run (apps.triggers.services), never on
the engine's path.
`mcp.call` calls a tool of an MCP server the trigger's tenant can see (apps.mcp);
the run's credentials are gone by then (its terminal commit clears them), so a
`${run.*}` header template of that server takes its fallback or refuses the hook.

Invariants:
- a job runs its hooks at most once: the run is claimed by a conditional
  UPDATE (pending -> running); a redelivered or late second call updates no
  row and does nothing (a crash mid-hooks leaves the job `running`, never
  re-run into duplicates);
- every hook's outcome is recorded in order ({kind, ok, error?}; the error
  storable and at most MAX_ERROR_CHARS, whatever a server answered); a failure
  of any kind (a refusal, a DB or Redis error) is logged and recorded and
  does not stop the hooks after it, and the job ends `done`;
- a channel.publish carries an idempotency key per (run, hook), so even a
  publish whose commit raced a crash cannot appear twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.utils import timezone

from apps.channels import services as channel_services
from apps.channels.selectors import channel_get
from apps.channels.streams import Stream
from apps.core.errors import ApplicationError, Invalid
from apps.core.http import storable_text
from apps.mcp import selectors as mcp_selectors
from apps.mcp import services as mcp_services
from apps.memory import services as memory_services
from apps.memory.models import MemoryScope
from apps.runs.statuses import RunStatus
from apps.substrate.models import ChannelScope
from apps.triggers.models import JobState, OnCompleteJob

log = logging.getLogger("loomcycle.triggers")

PUBLISHER = "_trigger"  # published_by of hook messages
MAX_ERROR_CHARS = 4 * 1024  # a hook's recorded error (results, the schedule's last_error)


def oncomplete_record(
    *,
    run_id: str,
    tenant_id: str,
    user_id: str,
    agent_id: str,
    agent_name: str,
    hooks: list[dict[str, Any]],
    origin: dict[str, Any],
    agent_scope_id: str,
) -> None:
    """Record the hooks of a run being created (call inside its creating transaction)."""
    if hooks:
        OnCompleteJob.objects.create(
            run_id=run_id,
            tenant_id=tenant_id,
            user_id=user_id,
            agent_id=agent_id,
            agent_name=agent_name,
            agent_scope_id=agent_scope_id,
            hooks=hooks,
            origin=origin,
        )


def oncomplete_run(run_id: str, status: str) -> list[dict[str, Any]] | None:
    """Run the hooks of `run_id` if it ended completed and this call wins the
    claim; their outcomes, else None (no job, already claimed, or not completed)."""
    if status != RunStatus.COMPLETED:
        _close(run_id, status)
        return None
    # Compare-and-set: of any number of callers (engine, sweep, a redelivery) one wins.
    won = OnCompleteJob.objects.filter(run_id=run_id, state=JobState.PENDING).update(
        state=JobState.RUNNING, run_status=status
    )
    if not won:
        return None
    job = OnCompleteJob.objects.get(run_id=run_id)
    results = [_run_hook(job, index, hook) for index, hook in enumerate(job.hooks)]
    OnCompleteJob.objects.filter(run_id=run_id).update(state=JobState.DONE, results=results, finished_at=timezone.now())
    return results


def _close(run_id: str, status: str) -> None:
    """A run that did not complete runs no hook: its job is done, results empty."""
    OnCompleteJob.objects.filter(run_id=run_id, state=JobState.PENDING).update(
        state=JobState.DONE, run_status=status, finished_at=timezone.now()
    )


def _run_hook(job: OnCompleteJob, index: int, hook: dict[str, Any]) -> dict[str, Any]:
    kind = str(hook.get("kind"))
    runner = _RUNNERS.get(kind)
    try:
        if runner is None:
            raise Invalid(f"hook kind {kind!r} is not supported by this build", code="hook_unsupported")
        runner(job, index, hook)
    except ApplicationError as exc:
        log.warning("run %s: on_complete[%d] %s failed: %s: %s", job.run_id, index, kind, exc.code, exc.message)
        # The message may quote a server's answer (mcp.call): storable and bounded before it is recorded.
        error = storable_text(f"{exc.code}: {exc.message}"[:MAX_ERROR_CHARS])
        return {"kind": kind, "ok": False, "error": error}
    except Exception as exc:  # a DB or Redis error: logged with its traceback, recorded, the next hook still runs
        log.exception("run %s: on_complete[%d] %s raised", job.run_id, index, kind)
        return {"kind": kind, "ok": False, "error": storable_text(f"internal: {exc!r}"[:MAX_ERROR_CHARS])}
    return {"kind": kind, "ok": True}


def _publish(job: OnCompleteJob, index: int, hook: dict[str, Any]) -> None:
    name = str(hook["channel"])
    declared = channel_get(tenant_id=job.tenant_id, name=name)
    scope_id = ""
    if declared.scope == ChannelScope.USER:
        scope_id = _needed(job.user_id, f'channel "{name}" has scope=user but the run has no user_id')
    elif declared.scope == ChannelScope.AGENT:
        scope_id = job.agent_name
    message = {**job.origin, "run_id": job.run_id, "agent_id": job.agent_id, "payload": hook.get("payload")}
    channel_services.publish(
        stream=Stream(job.tenant_id, name, declared.scope, scope_id),
        declared=declared,
        value=message,
        published_by=PUBLISHER,
        idempotency_key=f"oncomplete:{job.run_id}:{index}",
    )


def _memory_set(job: OnCompleteJob, index: int, hook: dict[str, Any]) -> None:
    scope = str(hook["scope"])
    if scope == MemoryScope.GLOBAL and job.tenant_id:
        raise Invalid("global memory is written only by the deployment's own tenant", code="forbidden")
    scope_id = {
        MemoryScope.AGENT: job.agent_scope_id,
        MemoryScope.USER: job.user_id,
    }.get(MemoryScope(scope), "")
    if scope in (MemoryScope.AGENT, MemoryScope.USER):
        _needed(scope_id, f"memory.set scope={scope} needs a {'user_id' if scope == 'user' else 'name'}")
    tenant = "" if scope == MemoryScope.GLOBAL else job.tenant_id
    slot = memory_services.Slot(tenant, scope, scope_id)
    memory_services.memory_set(slot=slot, key=str(hook["key"]), value=hook.get("payload"))


def _mcp_call(job: OnCompleteJob, index: int, hook: dict[str, Any]) -> None:
    name = str(hook["server"])
    row = mcp_selectors.server_resolve(tenant_id=job.tenant_id, name=name)
    if row is None:
        raise Invalid(f"mcp server {name!r} not found", code="hook_target_missing")
    outcome = mcp_services.mcp_call(row=row, tool=str(hook["tool"]), args=dict(hook.get("args") or {}), credentials={})
    if outcome.is_error:
        raise Invalid(outcome.text, code="mcp_call_failed")


def _needed(value: str, message: str) -> str:
    if not value:
        raise Invalid(message, code="hook_target_missing")
    return value


_RUNNERS: dict[str, Callable[[OnCompleteJob, int, dict[str, Any]], None]] = {
    "channel.publish": _publish,
    "memory.set": _memory_set,
    "mcp.call": _mcp_call,
}
