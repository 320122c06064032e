"""`?sync=true`: wait for a run's terminal status without holding a thread.

The view awaits here on the web process's event loop: a Redis pub/sub
wake-up (`lc:run:<id>`, rung by the worker after each commit, multiplexed by
apps.core.pubsub) or a 1 s re-read, whichever comes first, as the SSE
streams do (apps.runs.streams). The status read takes a worker thread for
the query only. With Redis unreachable the wait goes on by the 1 s re-reads
alone: the run was committed before the wait began, so the caller still
gets its terminal status (or 504 with the run id), never a 500."""

from __future__ import annotations

import asyncio
import logging

from redis import RedisError

from apps.core.http import db_call
from apps.core.pubsub import hub
from apps.runs.dispatch import run_channel
from apps.runs.models import TERMINAL
from apps.runs.selectors import run_status

log = logging.getLogger("loomcycle.webhooks")

REPOLL_S = 1.0


async def run_terminal_status(run_id: str, timeout_s: float) -> str | None:
    """The run's terminal status, or None if it is not terminal within `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    bells = hub()
    try:
        wake: asyncio.Queue[str] | None = await bells.subscribe(run_channel(run_id))  # before the first read
    except (RedisError, OSError) as exc:
        log.warning("sync wait for run %s: no Redis doorbell (%s); re-reading every %.0f s", run_id, exc, REPOLL_S)
        wake = None
    read = db_call(run_status)
    try:
        while True:
            status = await read(run_id=run_id)
            if status is None or status in TERMINAL:
                return status
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None
            if wake is None:
                await asyncio.sleep(min(REPOLL_S, remaining))  # the re-read timer, no doorbell to wait on
                continue
            try:
                await asyncio.wait_for(wake.get(), timeout=min(REPOLL_S, remaining))
            except TimeoutError:
                continue  # re-read: a lost wake-up costs latency, never the answer
    finally:
        if wake is not None:
            await _unsubscribe(run_id, wake)


async def _unsubscribe(run_id: str, wake: asyncio.Queue[str]) -> None:
    try:
        await hub().unsubscribe(run_channel(run_id), wake)
    except (RedisError, OSError) as exc:
        log.warning("sync wait for run %s: unsubscribe failed: %s", run_id, exc)
