"""Admitting a run whose caller streams it: the one verb POST /v1/runs, the session routes and
the gRPC Run/Continue share (each transport then presents the run's frames its own way).

The stream's fairness slot is taken before the run exists (a 429 there starts nothing); a run
created over max_concurrent_runs waits for its slot up to queue_timeout_ms (429 and no run past
it, apps.runs.backpressure). The caller owns the returned slot: `async with slot.held()` for
the stream's life."""

from __future__ import annotations

from collections.abc import Callable

from asgiref.sync import sync_to_async

from apps.core.types import Principal
from apps.gateway.fairness.streams import StreamSlot, astream_slot
from apps.runs import backpressure
from apps.runs.models import Run, RunStatus


async def admit_streamed(principal: Principal, create: Callable[[], Run]) -> tuple[Run, StreamSlot]:
    """The run `create` makes (in a worker thread), admitted, and the caller's stream slot."""
    slot = await astream_slot(principal)
    try:
        run = await sync_to_async(create, thread_sensitive=False)()
        if run.status == RunStatus.WAITING_SLOT:
            with slot.kept():  # the wait may outlast the slot's TTL
                await backpressure.slot_awaited(run.id, backpressure.limits().queue_timeout_ms)
    except BaseException:
        await slot.release()
        raise
    return run, slot
