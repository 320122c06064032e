"""A user's run-state stream (GET /v1/users/{user_id}/agents/stream, gRPC StreamUserRunStates):
`stream_open`, then one `run_state` frame per state change of any of the user's runs, keepalives,
until the stream's lifetime ends.

Postgres is what it reads, as every stream here: each poll reads the user's live runs (index
run_user_status) and the runs that ended since the last poll (index run_user_ended), and a frame
goes out for every run whose state differs from the one last sent (a new run: its first state).
So every transition a run rests in for a poll is seen, and every end is seen even when the run
started and ended between two polls (its end only). A run that passes through a state for less
than a poll (queued -> running within one) shows only where it rests. What the stream gives up
against a log: a client that needs every transition reads the run's events (GET
/v1/runs/{id}/events); a client that reconnects reconciles with GET /v1/runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime, timedelta

from asgiref.sync import sync_to_async
from django.db import connection
from django.utils import timezone

from apps.core.timefmt import iso_z
from apps.runs.models import PARKED, RUNNABLE, TERMINAL, Run
from apps.runs.presenters import agent_out
from apps.runs.streams import KEEPALIVE, Frame

POLL_S = 1.0
OVERLAP = timedelta(seconds=30)  # longer than a step commit's transaction
MAX_LIFETIME_S = 30 * 60  # SPEC 2.3: a user stream lasts at most 30 minutes
LIVE = [*RUNNABLE, *PARKED]


@dataclass(frozen=True)
class Wanted:
    tenant_id: str | None  # None: an admin's read of every tenant
    user_id: str
    statuses: frozenset[str] = frozenset()  # empty: every state; `running` = every live state
    agent: str = ""


def state_frame(run: Run) -> Frame:
    out = agent_out(run)
    data = {
        "run_id": run.id,
        "agent_id": run.agent_id,
        "agent": run.agent_name,
        "user_id": run.user_id,
        "parent_agent_id": out["parent_agent_id"],
        "parent_run_id": run.parent_id,
        "status": out["status"],
        "state": run.status,
        "awaited_state": out["awaited_state"],
        "stop_reason": run.stop_reason,
        "error": run.error,
        "ts": iso_z(timezone.now()),
        "parent_context": run.parent_context,
    }
    return Frame("run_state", data)


def _poll(w: Wanted, since: datetime) -> list[Run]:
    """The user's live runs and those that ended after `since`."""
    try:
        qs = Run.objects.select_related("parent", "resident").filter(user_id=w.user_id)
        if w.tenant_id is not None:
            qs = qs.filter(tenant_id=w.tenant_id)
        if w.agent:
            qs = qs.filter(agent_name=w.agent)
        live = list(qs.filter(status__in=LIVE))
        ended = list(qs.filter(completed_at__gt=since, status__in=list(TERMINAL)))
        return live + ended
    finally:
        connection.close()


def _kept(w: Wanted, run: Run) -> bool:
    if not w.statuses:
        return True
    return run.status in w.statuses or ("running" in w.statuses and run.status in LIVE)


async def user_state_frames(w: Wanted, keepalive_s: float) -> AsyncGenerator[Frame, None]:
    """`stream_open`, then run_state frames (module docstring), forever: the caller bounds it."""
    poll = sync_to_async(_poll, thread_sensitive=False)
    sent: dict[str, tuple[str, datetime | None]] = {}  # run id -> (state last sent, its end)
    opened, last_sent = timezone.now(), time.monotonic()
    yield Frame("stream_open", {"user_id": w.user_id, "ts": iso_z(opened)})
    since = opened - OVERLAP
    while True:
        started = timezone.now()
        for run in await poll(w, since):
            known = sent.get(run.id)
            if known is not None and known[0] == run.status:
                continue
            sent[run.id] = (run.status, run.completed_at)
            ended_before = run.completed_at is not None and run.completed_at < opened and known is None
            if _kept(w, run) and not ended_before:  # an end from before the stream opened is not news
                last_sent = time.monotonic()
                yield state_frame(run)
        # An end's completed_at is its transaction's start: the next poll looks OVERLAP further back,
        # and ends already sent are remembered as long as that window can show them again.
        since = started - OVERLAP
        sent = {k: v for k, v in sent.items() if v[1] is None or v[1] >= since}
        if time.monotonic() - last_sent >= keepalive_s:
            last_sent = time.monotonic()
            yield KEEPALIVE
        await asyncio.sleep(POLL_S)
