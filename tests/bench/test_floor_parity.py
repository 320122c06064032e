"""The floor bench's Celery app (bench/floor_app.py) runs on the engine's own Celery configuration:
engine/floor compares like with like (issue 43)."""

from __future__ import annotations

from bench import floor_app
from workers.celery import app as engine

# Celery("floor") made itself the process's current app; the engine's code (workers/doorbell.py
# reads current_app) and other tests in this process expect the engine's.
engine.set_current()

# What makes a hop cost what it costs: the broker and its transport, acks, prefetch, serialization, events.
KEYS = (
    "broker_url",
    "broker_transport",
    "broker_transport_options",
    "task_acks_late",
    "task_reject_on_worker_lost",
    "worker_prefetch_multiplier",
    "task_ignore_result",
    "task_serializer",
    "accept_content",
    "worker_send_task_events",
    "task_time_limit",
)


def test_the_floor_hops_on_the_engines_celery_configuration() -> None:
    floor = floor_app.app.conf
    assert {key: floor[key] for key in KEYS} == {key: engine.conf[key] for key in KEYS}
    assert engine.conf.broker_transport  # the engine's fast transport, which the floor now shares
    assert floor.task_default_queue == "floor"  # only its queue is its own
