"""Doorbells and wake-ups. The message is a doorbell carrying (run_id, step) and,
when the step commit armed the step's lease, its token (kwarg `token`);
Postgres is the truth. Everything here is called only AFTER a commit."""

from __future__ import annotations

import logging
import threading
import time

from celery import current_app
from django.conf import settings

from apps.core.redis import sync_client
from workers import doorbell
from workers.queues import ITERATE_TASK, RUNS

log = logging.getLogger("loomcycle.engine")


# Set in Redis by the lease sweep; absent means Redis lost its data (or is new): see broker_emptied.
BROKER_MARK_KEY = "lc:broker:mark"


def broker_emptied() -> bool:
    """True when the broker's Redis has no mark: it restarted without its data (or was
    flushed, or is new), so the doorbells queued in it are lost (apps.runs.services.run_leases_sweep)."""
    return not sync_client().exists(BROKER_MARK_KEY)


def broker_mark() -> None:
    sync_client().set(BROKER_MARK_KEY, "1")


def run_channel(run_id: str) -> str:
    return f"lc:run:{run_id}"


def enqueue_iteration(run_id: str, step: int) -> None:
    wake_and_enqueue(run_id, None, step)


def wake_and_enqueue(run_id: str, last_seq: int | None, step: int | None, token: int | None = None) -> None:
    """After a commit: wake stream readers (if `last_seq`) and ring the doorbell
    for `step` (if given), in one Redis round trip (workers/doorbell.py). `token`:
    the lease the step commit armed for `step`, which the doorbell's worker adopts
    (apps.runs.engine.adopt); without one, it claims."""
    kwargs = {} if token is None else {"token": token}
    if step is not None and not doorbell.direct():
        if last_seq is not None:
            notify_events(run_id, last_seq)
        _send_task(run_id, step, kwargs)
        return
    pipe = doorbell.DoorbellPipe()
    if last_seq is not None:
        pipe.publish(run_channel(run_id), str(last_seq))
    if step is not None:
        pipe.doorbell(ITERATE_TASK, (run_id, step), RUNS, kwargs)
    pipe.send()


def _send_task(run_id: str, step: int, kwargs: dict[str, int]) -> None:
    # `argsrepr` spares Celery a saferepr of the arguments; `declare=[]` skips
    # re-binding a copy of the routed queue on every publish (the broker needs
    # no declaration to deliver: on Redis a queue is a list the workers read).
    current_app.send_task(
        ITERATE_TASK,
        args=(run_id, step),
        kwargs=kwargs,
        argsrepr=f"({run_id!r}, {step})",
        kwargsrepr=repr(kwargs),
        declare=[],
    )


TIMINGS_FLUSH_S = 0.1
_timings: list[str] = []
_timings_lock = threading.Lock()
_flusher: threading.Thread | None = None


def record_timing(total_s: float, provider_s: float, admission_s: float) -> None:
    """Opt-in (LOOMCYCLE_ENGINE_TIMINGS_KEY): one sample per committed iteration
    ("total_ms,provider_ms,admission_wait_ms"; the wait is not in the total).

    Samples are buffered and pushed by one thread every TIMINGS_FLUSH_S, so
    that measuring costs the measured iteration no Redis round trip."""
    global _flusher
    if not settings.LOOMCYCLE.engine_timings_key:
        return
    with _timings_lock:
        _timings.append(f"{total_s * 1000:.3f},{provider_s * 1000:.3f},{admission_s * 1000:.3f}")
        if _flusher is None:
            _flusher = threading.Thread(target=_flush_timings, name="lc-timings", daemon=True)
            _flusher.start()


def _flush_timings() -> None:
    while True:
        time.sleep(TIMINGS_FLUSH_S)
        with _timings_lock:
            batch = _timings[:]
            _timings.clear()
        key = settings.LOOMCYCLE.engine_timings_key
        if batch and key:
            try:
                sync_client().rpush(key, *batch)
            except Exception:  # a benchmark aid: a lost batch shows up as fewer samples; keep flushing
                log.exception("engine timing samples lost (%d)", len(batch))


def notify_events(run_id: str, last_seq: int) -> None:
    """Wake stream readers; at-most-once, readers re-read Postgres."""
    sync_client().publish(run_channel(run_id), str(last_seq))
