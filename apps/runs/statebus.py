"""A run's state changes, announced on Redis pub/sub for the user's run-state stream
(apps.runs.userstream): `lc:user:<tenant>:<user>` carries `{"run_id", "status"}` for each
transition of one of that user's runs, published after the transition committed by the process
that committed it.

Who announces: a run's creation (apps.runs.create), its first claim (queued -> running, the
engine), each step commit that changes its status (parks and ends, the engine), a wake by input
or by the answer of its last pending call (apps.runs.services, apps.runs.wake), and a cancel of
a run no worker holds (apps.runs.cancel). The rarer transitions (admission and session
promotion, fan-out start, budget wake, runtime pause/resume, retry) are not announced: the
stream's Postgres read (at open, after every announcement, and every REPOLL_S) shows them.

At most once, as every pub/sub message here: a lost announcement (Redis away, a reader's queue
full) costs the stream that state if it lasted less than a read period, never the run's
current state. Cost: one PUBLISH per transition (a steady running step announces nothing).
"""

from __future__ import annotations

import json
import logging

from django.db import transaction
from redis import RedisError

from apps.core.redis import sync_client

log = logging.getLogger("loomcycle.runs")


def user_channel(tenant_id: str, user_id: str) -> str:
    return f"lc:user:{tenant_id}:{user_id}"


def announce(*, tenant_id: str, user_id: str, run_id: str, status: str) -> None:
    """After the commit: tell the user's stream readers. A Redis error is logged, never raised
    (the transition is committed; the readers' Postgres read shows it)."""
    try:
        sync_client().publish(user_channel(tenant_id, user_id), json.dumps({"run_id": run_id, "status": status}))
    except (RedisError, OSError):
        log.warning("run %s: its %s state was not announced to the user's streams", run_id, status, exc_info=True)


def announce_on_commit(*, tenant_id: str, user_id: str, run_id: str, status: str) -> None:
    transaction.on_commit(
        lambda: announce(tenant_id=tenant_id, user_id=user_id, run_id=run_id, status=status), robust=True
    )
