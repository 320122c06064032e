"""Doorbells written straight to the broker's list, one pipelined round trip.

A doorbell is a `runs.iterate(run_id, step)` task message (with the kwarg
`token` when the step commit armed the step's lease: apps.runs.engine.adopt). Celery's
`send_task` spends ~400 us of CPU on each one (routing, option merging,
signals, a producer from a pool, kombu's message preparation), about a tenth
of an iteration's CPU in a worker. The message itself is small and fixed: the
Celery message protocol v2 (headers + a `[args, kwargs, embed]` body) in
kombu's Redis envelope (a JSON object LPUSHed to the queue's list, its body
base64-encoded). `DoorbellPipe` writes exactly that envelope, so a stock
Celery worker consumes it like any other task, and lets the engine send the
stream wake-up PUBLISH in the same round trip.

tests/core/test_plumbing.py pins the envelope to what `send_task` writes with
the pinned Celery and kombu, field by field. What these messages do not do:
fire Celery's `before_task_publish`/`after_task_publish` signals, or go
through kombu's publish retry (redis-py's own retry applies instead). Lost
doorbells are recovered by the lease sweeper either way (architecture.md).
So no publish span is made for a doorbell; the trace context still travels:
with a span current, its W3C headers (`traceparent`) are put in the message
headers, where the Celery instrumentation's publish hook would have put them
and where its consumer hook reads them (docs/architecture.md, "Tracing").

Used only when `LOOMCYCLE_FAST_TRANSPORT` is on (the default) and the broker
is the Redis that `REDIS_URL` names, without a key prefix; otherwise
`apps.runs.dispatch` falls back to `send_task`. Either way the worker sees the
same message, and a duplicate or lost doorbell is handled the same way (the
claim, the sweeper).
"""

from __future__ import annotations

import base64
import functools
import json
import uuid
from typing import Any

from celery import current_app
from celery.utils.nodenames import anon_nodename
from django.conf import settings
from opentelemetry import propagate, trace

from apps.core.redis import sync_client

_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@functools.cache
def direct() -> bool:
    """True when doorbells can be LPUSHed to the broker's list directly (settings
    are read once per process)."""
    options = getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}) or {}
    redis_url = str(settings.REDIS_URL)
    # settings.py hands kombu a redis+socket:// URL in its socket:// form (workers/transport.py).
    return bool(
        settings.LOOMCYCLE.fast_transport
        and settings.CELERY_BROKER_URL in (redis_url, redis_url.removeprefix("redis+"))
        and str(settings.REDIS_URL).startswith(("redis://", "rediss://", "redis+socket://", "unix://"))
        and not options.get("global_keyprefix")
    )


def _timelimit(task_name: str) -> list[int | None]:
    task = current_app.tasks.get(task_name) if getattr(current_app, "finalized", False) else None
    return [getattr(task, "time_limit", None), getattr(task, "soft_time_limit", None)]


def envelope(task_name: str, args: tuple[Any, ...], queue: str, kwargs: dict[str, Any] | None = None) -> str:
    """The message `send_task(task_name, args=args, kwargs=kwargs)` would LPUSH to `queue`."""
    kwargs = kwargs or {}
    task_id = str(uuid.uuid4())
    root_id: str | None = task_id
    parent_id: str | None = None
    parent = current_app.current_worker_task
    if parent is not None:  # as send_task: a doorbell sent from a task is its child
        root_id = parent.request.root_id or parent.request.id
        parent_id = parent.request.id
    argsrepr = repr(args)
    kwargsrepr = repr(kwargs)
    body = json.dumps([list(args), kwargs, _EMBED]).encode()
    headers: dict[str, Any] = {
        "lang": "py",
        "task": task_name,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": _timelimit(task_name),
        "root_id": root_id,
        "parent_id": parent_id,
        "argsrepr": argsrepr,
        "kwargsrepr": kwargsrepr,
        "origin": anon_nodename(),
        "ignore_result": None,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
    }
    if trace.get_current_span().get_span_context().is_valid:  # a traced process, inside a span
        propagate.inject(headers)
    return json.dumps(
        {
            "body": base64.b64encode(body).decode(),
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": task_id,
                "reply_to": current_app.thread_oid,
                "argsrepr": argsrepr,
                "kwargsrepr": kwargsrepr,
                "delivery_mode": 2,
                "delivery_info": {"exchange": "", "routing_key": queue},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": str(uuid.uuid4()),
            },
        }
    )


class DoorbellPipe:
    """Collects PUBLISHes and doorbells; `send` writes them in one round trip.

    Priority 0 messages live in the list named after the queue (kombu's
    `_q_for_pri`), which workers BRPOP."""

    def __init__(self) -> None:
        self._pipe = sync_client().pipeline(transaction=False)

    def publish(self, channel: str, message: str) -> None:
        self._pipe.publish(channel, message)

    def doorbell(self, task_name: str, args: tuple[Any, ...], queue: str, kwargs: dict[str, Any] | None = None) -> None:
        self._pipe.lpush(queue, envelope(task_name, args, queue, kwargs))

    def send(self) -> None:
        if len(self._pipe):
            self._pipe.execute()
