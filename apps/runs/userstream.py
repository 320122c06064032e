"""A user's run-state stream (GET /v1/users/{user_id}/agents/stream, gRPC StreamUserRunStates):
`stream_open`, then one `run_state` frame per state change of any of the user's runs, keepalives,
until the stream's lifetime ends.

Fed by the run lifecycle: the process that commits a transition announces it on the user's Redis
channel (apps.runs.statebus, `lc:user:<tenant>:<user>`, subscribed BEFORE the first read), and the
stream sends the announced state at once, so a state held for a few milliseconds (a park woken at
once) is seen. Postgres stays the truth: the user's live runs (index run_user_status) and the runs
that ended since the last read (index run_user_ended) are read at open, after every batch of
announcements, and every REPOLL_S, and a frame goes out for every run whose state differs from the
one last sent. So announcements that arrive out of order (two processes) end on the row's state,
and a lost one (Redis away, a full queue: a gap) costs only that short state, never the run's
current one. An admin's read across tenants (`tenant_id` None) has no channel: it reads only.
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from asgiref.sync import sync_to_async
from django.db import connection
from django.utils import timezone

from apps.core.pubsub import hub
from apps.core.timefmt import iso_z
from apps.runs.models import PARKED, RUNNABLE, TERMINAL, Run
from apps.runs.presenters import agent_out
from apps.runs.statebus import user_channel
from apps.runs.streams import KEEPALIVE, Frame

REPOLL_S = 1.0  # the Postgres read without an announcement
QUEUE = 256  # announcements waiting for one reader; past it they are dropped (the next read covers them)
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


@dataclass
class _Sent:
    """What the stream has sent: run id -> (state last sent, its end), and since when ends are news."""

    opened: datetime
    since: datetime
    runs: dict[str, tuple[str, datetime | None]] = field(default_factory=dict)

    def news(self, w: Wanted, run: Run) -> Frame | None:
        known = self.runs.get(run.id)
        if known is not None and known[0] == run.status:
            return None
        self.runs[run.id] = (run.status, run.completed_at)
        ended_before = run.completed_at is not None and run.completed_at < self.opened and known is None
        if _kept(w, run) and not ended_before:  # an end from before the stream opened is not news
            return state_frame(run)
        return None

    def forget_old(self, since: datetime) -> None:
        # An end's completed_at is its transaction's start: the next read looks OVERLAP further back,
        # and ends already sent are remembered as long as that window can show them again.
        self.since = since
        self.runs = {k: v for k, v in self.runs.items() if v[1] is None or v[1] >= since}


def _announced(w: Wanted, states: list[tuple[str, str]]) -> list[Run]:
    """The announced runs' rows (still the user's, in the tenant), one per announcement in its order,
    each with its announced state."""
    try:
        qs = Run.objects.select_related("parent", "resident").filter(id__in={r for r, _ in states}, user_id=w.user_id)
        if w.tenant_id is not None:
            qs = qs.filter(tenant_id=w.tenant_id)
        if w.agent:
            qs = qs.filter(agent_name=w.agent)
        rows = {r.id: r for r in qs}
    finally:
        connection.close()
    out = []
    for run_id, status in states:
        if run_id in rows:
            run = copy.copy(rows[run_id])
            run.status = status
            out.append(run)
    return out


def _parsed(raw: list[str]) -> list[tuple[str, str]]:
    """Announcements (apps.runs.statebus) -> (run id, state); a malformed one is skipped."""
    states = []
    for data in raw:
        try:
            msg = json.loads(data)
            states.append((str(msg["run_id"]), str(msg["status"])))
        except (ValueError, KeyError, TypeError):
            continue
    return states


async def user_state_frames(w: Wanted, keepalive_s: float) -> AsyncGenerator[Frame, None]:
    """`stream_open`, then run_state frames (module docstring), forever: the caller bounds it."""
    poll = sync_to_async(_poll, thread_sensitive=False)
    announced = sync_to_async(_announced, thread_sensitive=False)
    channel = user_channel(w.tenant_id, w.user_id) if w.tenant_id is not None else ""
    bells = hub()
    queue: asyncio.Queue[str] = asyncio.Queue(maxsize=QUEUE)
    if channel:
        await bells.subscribe(channel, queue=queue)  # before the first read: no transition falls between
    try:
        opened, last_sent = timezone.now(), time.monotonic()
        sent = _Sent(opened=opened, since=opened - OVERLAP)
        yield Frame("stream_open", {"user_id": w.user_id, "ts": iso_z(opened)})
        rung: list[str] = []
        while True:
            while not queue.empty():
                rung.append(queue.get_nowait())
            states, rung = _parsed(rung), []
            runs = await announced(w, states) if states else []
            started = timezone.now()
            runs += await poll(w, sent.since)
            for run in runs:
                frame = sent.news(w, run)
                if frame is not None:
                    last_sent = time.monotonic()
                    yield frame
            sent.forget_old(started - OVERLAP)
            if time.monotonic() - last_sent >= keepalive_s:
                last_sent = time.monotonic()
                yield KEEPALIVE
            rung = await _rung(queue, REPOLL_S)
    finally:
        if channel:
            await bells.unsubscribe(channel, queue)


async def _rung(queue: asyncio.Queue[str], timeout: float) -> list[str]:
    """The first announcement to arrive within `timeout`, if any."""
    try:
        return [await asyncio.wait_for(queue.get(), timeout)]
    except TimeoutError:
        return []
