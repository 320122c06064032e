"""The tool phase of an iteration: the calls under policy (apps.runs.engine.toolrun), spawns
and parks prepared for the commit, the results in tool_call order. The calls' records are written
by the step commit (store.commit_step), not before the tools run: a redelivered iteration repeats
the calls with the same (run_id, step, call_id) keys either way."""

from __future__ import annotations

import threading
import time

from django.db import connection

from apps.core import privileged
from apps.core.errors import ApplicationError
from apps.core.tools import ToolContext, ToolResult, VolumeBinding
from apps.gateway.providers import (
    Done,
    ToolCall,
)
from apps.runs.children.spawn import spawn_prepare, spawns_abandon
from apps.runs.engine import metrics, turncancel
from apps.runs.engine.admission import ADMISSION, tools_after_s
from apps.runs.engine.toolrun import CallOutcome, run_calls
from apps.runs.engine.turncancel import CutKind, turn_cancelled
from apps.runs.engine.write import Next, StepWrite, cancelled_write, finish
from apps.runs.models import RunStatus
from apps.runs.store import ClaimedRun
from apps.substrate.selectors import agent_def_is_operator_yaml


def _tools_now(run: ClaimedRun) -> list[str]:
    """The run's tools, less the privileged ones its agent may not use now (apps.core.privileged):
    a run created before the rule, or before its tenant left LOOMCYCLE_BASH_TENANTS, loses them."""
    tools = list(run.tools)
    if not any(privileged.is_privileged(name) for name in tools):
        return tools
    yaml = agent_def_is_operator_yaml(def_id=run.agent_def_id)
    return privileged.narrowed(tools, tenant_id=run.tenant_id, operator_yaml=yaml)


def tool_phase(
    run: ClaimedRun, calls: list[ToolCall], cancel: threading.Event, write: StepWrite, done: Done
) -> StepWrite:
    write.tool_batch = [(c.id, c.name, c.input) for c in calls]
    write.tools_started_at = time.time()
    base = ToolContext(
        run_id=run.id,
        agent_id=run.agent_id,
        session_id=run.session_id,
        tenant_id=run.tenant_id,
        user_id=run.user_id,
        agent_name=run.agent_name,
        agent_def_id=run.agent_def_id,
        agent_def_sha256=run.agent_def_sha256,
        provider=run.provider,
        model=run.model,
        step=run.step,
        call_id="",
        tools=tuple(_tools_now(run)),
        credentials=run.credentials,
        volumes=tuple(VolumeBinding.from_dict(v) for v in run.volumes or []),
        cancelled=cancel,
        allowed_hosts=tuple(run.allowed_hosts),
        web_search_filter=str(run.routing.get("web_search_filter") or ""),
        batch=tuple(write.tool_batch),
    )
    connection.close()  # no connection is held while the tools run (each takes what it needs)
    with ADMISSION.outside(tools_after_s()):
        ran = run_calls(base, calls)
    _count_tool_calls(run, ran, write)
    outcomes = _prepare_spawns(run, ran, write)
    cut = turncancel.cut_now(run.id) if cancel.is_set() else turncancel.NO_CUT
    if cut.kind is not CutKind.NONE:  # the spawns and parks of this batch are dropped with the turn or run
        spawns_abandon(write.spawns, [o.result.park for o in ran if o.result.park is not None])
    if cut.kind is CutKind.RUN:
        return cancelled_write(cut.reason)
    if cut.kind is CutKind.TURN:
        turncancel.keep_finished_calls(write, calls, ran)
        return turn_cancelled(run, write, cut.reason)
    write.parks = [(o.call.id, o.result.park) for o in outcomes if o.result.park is not None]
    for o in outcomes:  # a parked call's own events (an interruption_pending) go out with the park
        if o.result.park is not None:
            write.events.extend(o.result.events)
    outcomes = [o for o in outcomes if o.result.park is None]
    by_id = {o.call.id: o.result for o in outcomes}
    for o in outcomes:  # events in completion order
        block = {"id": o.call.id, "name": o.call.name, "input": o.call.input}
        write.events.extend(o.result.events)
        write.events.append(
            {"type": "tool_result", "tool_use": block, "text": o.result.text, "is_error": o.result.is_error}
        )
        write.finished_calls.append((o.call.id, o.result.is_error))
    for call in (c for c in calls if c.id in by_id):  # transcript in tool_call order
        result = by_id[call.id]
        write.transcript.append(
            (
                "user",
                [{"type": "tool_result", "tool_use_id": call.id, "content": result.text, "is_error": result.is_error}],
            )
        )
    if write.spawns:  # park until the last child reports back
        write.status, write.next = RunStatus.WAITING_CHILDREN, Next.PARK
        return write
    if write.parks:  # park until every parked call is answered
        write.status, write.next = write.parks[0][1].status, Next.PARK
        return write
    if run.step + 1 >= run.max_iterations:
        return finish(write, "max_iterations")
    return write


def _count_tool_calls(run: ClaimedRun, ran: list[CallOutcome], write: StepWrite) -> None:
    """A tool label is a name of the run's effective tool set (bounded); any name
    the model made up outside it counts under one label."""
    for o in ran:
        tool = o.call.name if o.call.name in run.tools else metrics.NOT_ALLOWED
        write.metrics.inc(metrics.TOOL_CALLS, (tool, metrics.result_label(o.result.is_error)))
        write.metrics.observe(metrics.TOOL_SECONDS, (tool,), o.seconds)


def _prepare_spawns(run: ClaimedRun, outcomes: list[CallOutcome], write: StepWrite) -> list[CallOutcome]:
    """Spawn requests become write.spawns; refused ones become is_error results now."""
    now: list[CallOutcome] = []
    for o in outcomes:
        if o.result.spawn is None:
            now.append(o)
            continue
        try:
            write.spawns.append(
                spawn_prepare(
                    tenant_id=run.tenant_id,
                    user_id=run.user_id,
                    depth=run.depth,
                    call=o.call,
                    request=o.result.spawn,
                    user_tier=(run.routing or {}).get("user_tier") or None,
                    parent_id=run.id,
                    credentials=run.credentials,  # inherited as they are: a child never holds more
                )
            )
        except ApplicationError as exc:
            now.append(
                CallOutcome(o.call, ToolResult(f"cannot spawn {o.result.spawn.agent!r}: {exc.message}", is_error=True))
            )
    if write.spawns:
        connection.close()
    return now
