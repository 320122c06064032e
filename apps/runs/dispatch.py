"""Doorbells and wake-ups. The message is a doorbell carrying (run_id, step);
Postgres is the truth. Everything here is called only AFTER a commit."""

from __future__ import annotations

from celery import current_app

from apps.core.redis import sync_client
from loomcycle_project import env as E

ITERATE_TASK = "runs.iterate"


def run_channel(run_id: str) -> str:
    return f"lc:run:{run_id}"


def enqueue_iteration(run_id: str, step: int) -> None:
    # `argsrepr` spares Celery a saferepr of the arguments; `declare=[]` skips
    # re-binding a copy of the routed queue on every publish (the broker needs
    # no declaration to deliver: on Redis a queue is a list the workers read).
    current_app.send_task(
        ITERATE_TASK,
        args=(run_id, step),
        argsrepr=f"({run_id!r}, {step})",
        kwargsrepr="{}",
        declare=[],
    )


def record_timing(total_s: float, provider_s: float) -> None:
    """Opt-in (LOOMCYCLE_ENGINE_TIMINGS_KEY): one sample per committed iteration."""
    if E.ENGINE_TIMINGS_KEY:
        sync_client().rpush(E.ENGINE_TIMINGS_KEY, f"{total_s * 1000:.3f},{provider_s * 1000:.3f}")


def notify_events(run_id: str, last_seq: int) -> None:
    """Wake stream readers; at-most-once, readers re-read Postgres."""
    sync_client().publish(run_channel(run_id), str(last_seq))
