"""An agent's call of a remote A2A agent, as it calls a sub-agent. Invariants:

- The tool streams the peer's answer for up to LOOMCYCLE_A2A_CALL_INLINE_SECONDS in the
  iteration that made the call (text and a settled state end it: the result is the tool's).
  A peer still working then parks the run (`waiting_children`, as an Agent call does) on an
  A2ACall row inserted in the parked step's commit, so the row exists iff the run waits on it.
  No worker waits: beat (`calls_due`, every LOOMCYCLE_A2A_CALL_POLL_SECONDS) asks the peer
  for the task and answers the call through `apps.runs.wake.run_answer` once it settles, or
  past LOOMCYCLE_A2A_CALL_TIMEOUT_SECONDS with an error after cancelling the remote task.
- A row is claimed by a compare-and-set on `wake_at` before the peer is asked, so
  overlapping ticks ask once; no lock or transaction is held across the network.
- The run's end (a cancel included) marks its rows `abandoned`; the next sweep tells the
  peer to cancel the task and deletes them. The bearer a parked call needs is sealed on
  its row (apps.runs.credentials), since the run's own credentials go when it ends.
- Every text from the peer is redacted of the run's credentials before the model sees it.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from functools import partial

from a2a.types import TaskState
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.a2a import peers
from apps.a2a.models import A2ACall
from apps.a2a.peers import Peer, PeerFailed, Progress
from apps.core import egress
from apps.core.tools import Park, ToolContext, ToolResult
from apps.runs import credentials as run_credentials
from apps.runs.lifecycle import Ended
from apps.runs.models import RunStatus
from apps.runs.selectors import run_allowed_hosts_of
from apps.runs.wake import run_answer
from apps.substrate.kinds import get_kind
from apps.tools.httpcall import redact_credentials

log = logging.getLogger("loomcycle.a2a")

DUE_BATCH = 50


def _policy(allowed: tuple[str, ...] | list[str]) -> egress.HostPolicy:
    return egress.HostPolicy(
        allowed=tuple(allowed), private_allowlist=tuple(settings.LOOMCYCLE.http_private_host_allowlist)
    )


def _result(peer: Peer, progress: Progress, secrets: dict[str, str]) -> ToolResult:
    """A settled task as the tool's result."""
    text = redact_credentials(progress.text, secrets)
    state = TaskState.Name(progress.state).removeprefix("TASK_STATE_").lower()
    if progress.state == TaskState.TASK_STATE_COMPLETED:
        return ToolResult(text or f"[a2a {peer.name}] the task completed without text")
    if progress.state in (TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED):
        return ToolResult(f"[a2a {peer.name} task {progress.task_id}] {state}: {text}")
    return ToolResult(f"a2a peer {peer.name!r}: the task ended {state}: {text or '(no message)'}", is_error=True)


def call(ctx: ToolContext, peer: Peer, *, skill: str | None, prompt: str, tool_name: str) -> ToolResult:
    """The tool: stream the call inline, then park on it if the peer is still working."""
    bearer = ""
    if peer.bearer_ref:
        bearer = ctx.credentials.get(peer.bearer_ref, "")
        if not bearer:
            return ToolResult(f"a2a peer {peer.name!r} needs the run credential {peer.bearer_ref!r}", is_error=True)
    secrets = dict(ctx.credentials)
    connection.close()  # no DB connection is held while the peer works
    window = float(settings.LOOMCYCLE.a2a_call_inline_seconds)
    request = peers.message(prompt, skill)
    try:
        progress, cancelled = asyncio.run(
            peers.send(peer, bearer, _policy(ctx.allowed_hosts), request, window_s=window, cancelled=ctx.cancelled)
        )
    except PeerFailed as exc:
        return ToolResult(redact_credentials(f"a2a peer {peer.name!r}: {exc}", secrets), is_error=True)
    if cancelled:
        return ToolResult(f"a2a peer {peer.name!r}: the call was cancelled with the run", is_error=True)
    if progress.settled:
        return _result(peer, progress, secrets)
    if not progress.task_id:
        return ToolResult(f"a2a peer {peer.name!r} answered within {window:g} s with no task to follow", is_error=True)
    sealed = run_credentials.seal(run_id=ctx.run_id, credentials={"bearer": bearer} if bearer else {})
    record = partial(_record, peer, tool_name, progress, sealed, ctx.tenant_id)
    return ToolResult("", park=Park(status=RunStatus.WAITING_CHILDREN, record=record, after_commit=_parked))


def _record(
    peer: Peer, tool_name: str, progress: Progress, sealed: str, tenant_id: str, run_id: str, step: int, call_id: str
) -> None:
    """Inside the parked step's commit."""
    now = timezone.now()
    conf = settings.LOOMCYCLE
    A2ACall.objects.create(
        run_id=run_id,
        call_id=call_id,
        tool_name=tool_name,
        tenant_id=tenant_id,
        peer_def_id=peer.def_id,
        task_id=progress.task_id,
        credentials_sealed=sealed,
        text=progress.text,
        deadline=now + timedelta(seconds=conf.a2a_call_timeout_seconds),
        wake_at=now + timedelta(seconds=conf.a2a_call_poll_seconds),
    )


def _parked(run_id: str, call_id: str) -> None:
    log.info("run %s parked on A2A call %s", run_id, call_id)


def on_run_ended(ended: Ended) -> None:
    """apps.runs.lifecycle subscriber: the run's calls are abandoned; the next sweep tells the peers."""
    if A2ACall.objects.filter(run_id=ended.run_id).update(abandoned=True, wake_at=timezone.now()):
        from apps.a2a.tasks import a2a_calls_due_task

        transaction.on_commit(a2a_calls_due_task.delay)


def had_a2a_tool(ended: Ended) -> bool:
    return any(tool.startswith("a2a__") for tool in ended.tools)


# --- beat ---------------------------------------------------------------------


def _claim(call_id: int) -> A2ACall | None:
    """Compare-and-set on wake_at: only one sweep asks the peer for this call until the next poll."""
    now = timezone.now()
    later = now + timedelta(seconds=settings.LOOMCYCLE.a2a_call_poll_seconds)
    if not A2ACall.objects.filter(id=call_id, wake_at__lte=now).update(wake_at=later):
        return None
    return A2ACall.objects.filter(id=call_id).first()


def _peer_of(row: A2ACall) -> Peer | None:
    found = get_kind("a2aagent").model._default_manager.filter(id=row.peer_def_id).first()
    return Peer.of(found) if found is not None else None


def _bearer(row: A2ACall) -> str:
    return run_credentials.unseal(run_id=row.run_id, sealed=row.credentials_sealed).get("bearer", "")


def _answer(row: A2ACall, text: str, *, is_error: bool) -> None:
    with transaction.atomic():
        if A2ACall.objects.select_for_update().filter(id=row.id).first() is None:
            return  # answered or abandoned elsewhere
        secrets = {"bearer": _bearer(row)}
        run_answer(
            run_id=row.run_id,
            call_id=row.call_id,
            tool_name=row.tool_name,
            text=redact_credentials(text, secrets),
            is_error=is_error,
        )
        A2ACall.objects.filter(id=row.id).delete()


def call_check(call_id: int) -> str:
    """Ask the peer about one due call and answer it if it settled or is past its deadline."""
    row = _claim(call_id)
    if row is None:
        return "busy"
    peer, bearer = _peer_of(row), _bearer(row)
    policy = _policy(run_allowed_hosts_of(row.run_id))
    connection.close()
    if peer is None:
        _answer(row, "a2a peer definition is gone", is_error=True)
        return "answered"
    if row.abandoned:
        asyncio.run(peers.cancel(peer, bearer, policy, row.task_id))
        A2ACall.objects.filter(id=row.id).delete()
        return "abandoned"
    return _check_live(row, peer, bearer, policy)


def _check_live(row: A2ACall, peer: Peer, bearer: str, policy: egress.HostPolicy) -> str:
    try:
        progress = asyncio.run(peers.get(peer, bearer, policy, row.task_id))
    except PeerFailed as exc:
        log.warning("A2A call %s: asking peer %s failed: %s", row.id, peer.name, exc)
        progress = None
    if progress is not None and progress.settled:
        result = _result(peer, progress, {})
        _answer(row, result.text, is_error=result.is_error)
        return "answered"
    if timezone.now() >= row.deadline:
        asyncio.run(peers.cancel(peer, bearer, policy, row.task_id))
        limit = settings.LOOMCYCLE.a2a_call_timeout_seconds
        _answer(row, f"a2a peer {peer.name!r} did not answer within {limit} s (task cancelled)", is_error=True)
        return "answered"
    return "waiting"


def calls_due() -> int:
    """Beat: check the calls whose wake_at passed; abandoned ones first (their runs ended)."""
    due = list(
        A2ACall.objects.filter(wake_at__lte=timezone.now())
        .order_by("-abandoned", "wake_at")
        .values_list("id", flat=True)[:DUE_BATCH]
    )
    done = 0
    for call_id in due:
        try:
            done += call_check(call_id) != "busy"
        except Exception:  # one peer's failure must not stop the sweep; retried at the next wake_at
            log.exception("A2A call %s could not be checked; retrying at its next wake", call_id)
            connection.close()
    return done
