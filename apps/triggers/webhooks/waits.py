"""`?sync=true`: wait for a run's terminal status without holding a thread.

The view awaits here on the web process's event loop: a Redis pub/sub
wake-up (`lc:run:<id>`, rung by the worker after each commit, multiplexed by
apps.core.pubsub) or a 1 s re-read, whichever comes first, as the SSE
streams do (apps.runs.streams). The status read takes a worker thread for
the query only."""

from __future__ import annotations

import asyncio

from apps.core.http import db_call
from apps.core.pubsub import hub
from apps.runs.dispatch import run_channel
from apps.runs.models import TERMINAL
from apps.runs.selectors import run_status

REPOLL_S = 1.0


async def run_terminal_status(run_id: str, timeout_s: float) -> str | None:
    """The run's terminal status, or None if it is not terminal within `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    bells = hub()
    wake = await bells.subscribe(run_channel(run_id))  # before the first read: no wake-up is missed
    read = db_call(run_status)
    try:
        while True:
            status = await read(run_id=run_id)
            if status is None or status in TERMINAL:
                return status
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            try:
                await asyncio.wait_for(wake.get(), timeout=min(REPOLL_S, remaining))
            except TimeoutError:
                continue  # re-read: a lost wake-up costs latency, never the answer
    finally:
        await bells.unsubscribe(run_channel(run_id), wake)
