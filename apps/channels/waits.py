"""Parked Channel calls: a subscribe or await that has to wait parks its run
(`waiting_channel`) instead of holding a worker.

Invariants:
- The wait row is inserted in the parked step's own commit (`Park.record`),
  so it exists iff the run is parked on it.
- A wait is answered by whoever holds its row lock (SELECT ... FOR UPDATE)
  and is deleted in the same transaction that appends the answer to the run
  (`apps.runs.wake.run_answer`): it is answered once.
- Lost wake-ups are impossible: a publisher looks for waits AFTER its
  message committed, and the parking iteration re-checks its wait AFTER
  the wait committed (`Park.after_commit`); whichever comes second sees the
  other. Deadlines and deferred messages are rows (`wake_at`) that beat
  claims (`waits_due`), never long Celery ETAs.
- A subscribe answer commits the stream cursor with the answer; an await
  answer never moves cursors. A wait whose deadline passed is answered with
  what is there (possibly nothing): a timeout is not an error.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.db.models import Min
from django.utils import timezone

from apps.channels import cursors, presenters, selectors
from apps.channels.models import ChannelMessage, ChannelWait
from apps.channels.selectors import AwaitSpec
from apps.channels.streams import Stream
from apps.core.tools import Park
from apps.runs.models import RunStatus
from apps.runs.selectors import run_is_answerable
from apps.runs.wake import run_answer

log = logging.getLogger("loomcycle.channels")

DUE_BATCH = 200


@dataclass(frozen=True)
class WaitRequest:
    """What a parked call waits for, as stored in `ChannelWait.request`."""

    op: str  # subscribe | await
    streams: list[tuple[Stream, str | None]]  # (stream, from_cursor or None for the committed cursor)
    max_messages: int
    mode: str = "any"
    n: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "streams": [{**asdict(s), "from_cursor": c} for s, c in self.streams],
            "max_messages": self.max_messages,
            "mode": self.mode,
            "n": self.n,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> WaitRequest:
        streams = [
            (Stream(s["tenant_id"], s["channel"], s["scope"], s["scope_id"]), s.get("from_cursor"))
            for s in raw["streams"]
        ]
        return cls(raw["op"], streams, int(raw["max_messages"]), raw.get("mode", "any"), int(raw.get("n", 0)))


def park(request: WaitRequest, wait_ms: int) -> Park:
    """The Park a Channel call returns when nothing is there to read yet."""
    deadline = timezone.now() + timedelta(milliseconds=wait_ms)
    return Park(
        status=RunStatus.WAITING_CHANNEL,
        record=partial(_record, request, deadline),
        after_commit=_recheck,
    )


def _next_visible(streams: list[Stream]) -> datetime | None:
    """The earliest visible_at of a deferred (not yet visible) message on the streams."""
    soonest: datetime | None = None
    now = timezone.now()
    for s in streams:
        found = ChannelMessage.objects.filter(visible_at__gt=now, **s.filter()).aggregate(t=Min("visible_at"))["t"]
        if found is not None and (soonest is None or found < soonest):
            soonest = found
    return soonest


def _wake_at(request: WaitRequest, deadline: datetime) -> datetime:
    soonest = _next_visible([s for s, _ in request.streams])
    return min(deadline, soonest) if soonest is not None else deadline


def _record(request: WaitRequest, deadline: datetime, run_id: str, step: int, call_id: str) -> None:
    """Inside the parked step's commit."""
    ChannelWait.objects.create(
        run_id=run_id,
        call_id=call_id,
        tenant_id=request.streams[0][0].tenant_id,
        op=request.op,
        streams=sorted({s.key for s, _ in request.streams}),
        request=request.to_json(),
        deadline=deadline,
        wake_at=_wake_at(request, deadline),
    )


def _recheck(run_id: str, call_id: str) -> None:
    wait_id = ChannelWait.objects.filter(run_id=run_id, call_id=call_id).values_list("id", flat=True).first()
    if wait_id is not None:
        wait_try_answer(wait_id)


def _answer(request: WaitRequest, timed_out: bool) -> tuple[str, tuple[dict[str, Any], ...]] | None:
    """The answer text and events if the wait is satisfied (or timed out); None to keep waiting."""
    if request.op == "subscribe":
        stream, from_cursor = request.streams[0]
        read = cursors.subscribe(stream=stream, from_cursor=from_cursor, max_messages=request.max_messages)
        if not read.messages and not timed_out:
            return None
        return presenters.result_text(presenters.read_result(read)), tuple(presenters.delivery_events(read))
    spec = AwaitSpec(request.mode, request.n, request.max_messages)
    awaited = selectors.await_read(streams=request.streams, spec=spec, timed_out=timed_out)
    if not awaited.satisfied and not timed_out:
        return None
    return presenters.result_text(presenters.await_result(awaited)), ()


def wait_try_answer(wait_id: int, *, skip_locked: bool = False) -> str:
    """Answer wait `wait_id` if it is satisfied or due: "answered", "waiting",
    "gone" (its run ended: the wait is dropped) or "busy" (answered already,
    or, with `skip_locked`, being checked by another process right now).

    A publisher and the parking iteration's re-check WAIT for the row lock
    rather than skip it: a checker holding it may have read before their
    message committed, so skipping could lose the wake-up. Their read comes
    after the lock, so it sees what committed before. Only the beat sweep
    skips locked rows (whoever holds one is checking it)."""
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(_LOCK_WAIT_SQL.format(skip=" SKIP LOCKED" if skip_locked else ""), [wait_id])
            row = cur.fetchone()
        if row is None:
            return "busy"
        run_id, call_id, raw_request, deadline = row
        if not run_is_answerable(run_id=run_id):
            _delete(wait_id)
            return "gone"
        request = WaitRequest.from_json(raw_request if isinstance(raw_request, dict) else json.loads(raw_request))
        answer = _answer(request, timed_out=timezone.now() >= deadline)
        if answer is None:
            ChannelWait.objects.filter(id=wait_id).update(wake_at=_wake_at(request, deadline))
            return "waiting"
        text, events = answer
        run_answer(run_id=run_id, call_id=call_id, tool_name="Channel", text=text, is_error=False, events=events)
        _delete(wait_id)
    return "answered"


_LOCK_WAIT_SQL = """
SELECT w.run_id, w.call_id, w.request, w.deadline
FROM agent_channels_channelwait w
WHERE w.id = %s
FOR UPDATE OF w{skip}
"""


def _delete(wait_id: int) -> None:
    with connection.cursor() as cur:
        cur.execute("DELETE FROM agent_channels_channelwait WHERE id = %s", [wait_id])


def waits_answer_stream(stream: Stream) -> int:
    """After a publish to `stream` committed: answer the runs parked on it.
    Subscribers reading from the committed cursor share it, so once one of
    them finds nothing left the others like it are not tried; awaits and
    subscribes from their own cursor never consume for others: each is tried."""
    answered = 0
    drained = False
    waits = ChannelWait.objects.filter(tenant_id=stream.tenant_id, streams__contains=[stream.key])
    for wait_id, op, request in waits.order_by("created_at", "id").values_list("id", "op", "request"):
        shared = op == "subscribe" and all(s.get("from_cursor") is None for s in request["streams"])
        if shared and drained:
            continue
        outcome = wait_try_answer(wait_id)
        answered += outcome == "answered"
        drained = drained or (shared and outcome == "waiting")
    return answered


def waits_due(*, budget_s: float = 5.0) -> int:
    """Beat: answer waits whose deadline passed or whose deferred message is now
    visible, in batches, for at most `budget_s`. Safe to overlap (SKIP LOCKED)."""
    started = timezone.now()
    answered = 0
    while (timezone.now() - started).total_seconds() < budget_s:
        due = list(
            ChannelWait.objects.filter(wake_at__lte=timezone.now())
            .order_by("wake_at")
            .values_list("id", flat=True)[:DUE_BATCH]
        )
        if not due:
            break
        progressed = 0
        for wait_id in due:
            try:
                outcome = wait_try_answer(wait_id, skip_locked=True)
            except Exception:
                log.exception("channel wait %s could not be answered; retrying on the next tick", wait_id)
                connection.close()
                continue
            answered += outcome == "answered"
            progressed += outcome != "busy"
        if not progressed:  # everything due is being answered elsewhere
            break
    return answered
