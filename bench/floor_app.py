"""The floor for bench/loop.py: a bare Celery hop that INSERTs one ~4 KB JSONB
row and COMMITs, then enqueues the next hop; the last hop RPUSHes done.
Same broker, same Celery settings and the same worker pool as the engine's: its
configuration is the engine's own (loomcycle_project.celeryconfig, the CELERY_*
Django settings: broker transport, acks, prefetch, serializer, events off), only
its queue is its own. The engine's doorbell is a direct LPUSH (workers/doorbell.py)
where the floor's next hop goes through `apply_async`: that costs the floor
~0.4 ms of CPU per hop more (docs/performance.md), in the engine's favour."""

from __future__ import annotations

import json
import os
import random
import string
import threading

import redis
from celery import Celery
from psycopg_pool import ConnectionPool

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loomcycle_project.settings")
app = Celery("floor")
app.config_from_object("loomcycle_project.celeryconfig")  # the engine's settings (Django's, not set up)
app.conf.update(task_default_queue="floor", beat_schedule={})

_rnd = random.Random(7)
PAYLOAD = json.dumps(
    {
        "messages": [
            {"role": "user", "content": "".join(_rnd.choices(string.ascii_letters, k=440)), "id": f"m{k}"}
            for k in range(8)
        ]
    }
)
_lock = threading.Lock()
_state: dict[str, object] = {}


def _pool() -> ConnectionPool:
    with _lock:
        if "pool" not in _state:
            _state["pool"] = ConnectionPool(os.environ["FLOOR_PG"], min_size=1, max_size=16, open=True)
            _state["redis"] = redis.Redis.from_url(os.environ["FLOOR_REDIS"])
        return _state["pool"]  # type: ignore[return-value]


@app.task(name="floor.hop")
def hop(run: str, chain: int, i: int, n: int) -> None:
    with _pool().connection() as conn:  # commits on exit
        conn.execute(
            "INSERT INTO floor_ckpt (run, chain, step, payload) VALUES (%s, %s, %s, %s::jsonb)",
            (run, chain, i, PAYLOAD),
        )
    if i + 1 < n:
        hop.apply_async((run, chain, i + 1, n))
    else:
        _state["redis"].rpush(f"floor:done:{run}", chain)  # type: ignore[attr-defined]
