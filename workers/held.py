"""Doorbells a worker has taken but not finished, kept in Redis per worker, so
that those of a killed worker are rung again within lease + sweep seconds.

The transport keeps no kombu "unacked" copy of a `runs.iterate` doorbell
(workers/transport.py). A worker takes up to its prefetch window of them, and
most wait in admission (apps/runs/engine/admission.py) before their claim, where no
lease covers them. Without a copy, a `kill -9` lost them and their runs
waited for the sweeper's grace (`LOOMCYCLE_REQUEUE_GRACE_SECONDS`, 120 s).

So a worker records each doorbell it takes in its own hash,
`lc:held:<worker id>` (one HSET when the message is delivered, no MULTI/EXEC),
and the removal rides with the transport's deferred acks. The lease sweeper
(`recover_dead`, through workers/transport.py's `recover` when the broker is served by that
transport) pushes back onto their queues the doorbells of every worker
whose presence key has expired (workers/signals.py; its TTL is the lease), and
drops that hash. A doorbell re-rung although its iteration had started or
finished is a stale doorbell, which the claim turns into a no-op; a worker that
was only slow to refresh its presence costs duplicates, nothing else.

What it gives up: a process killed between Redis answering BRPOP and the HSET
(microseconds) loses that doorbell as before (kombu's own bookkeeping has the
same window); the sweeper's grace still re-rings it.

Only with the fast transport (LOOMCYCLE_FAST_TRANSPORT, the default). With
kombu's stock transport a doorbell is in kombu's unacked hash like any task,
`transport.recover` finds no channel of ours and does nothing, and a killed worker's
doorbells come back through the sweeper's grace (the run sat unleased) or,
later, kombu's visibility timeout (a duplicate, a no-op at the claim).

Private kombu API: the push-back uses the Redis channel's
`_do_restore_message` (the same call kombu's own restore of unacked messages
makes); workers/transport.py lists what it relies on and
tests/core/test_kombu_seams.py pins it.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from typing import Any

from django.conf import settings
from kombu.utils.json import dumps, loads

log = logging.getLogger("loomcycle.transport")

HELD_PREFIX = "lc:held:"
PRESENCE_PREFIX = "lc:worker:"
WEB_PRESENCE_PREFIX = "lc:web:"  # a web process's presence (loomcycle_project.replicas): /healthz only
STARTED_AT = time.time()
# One id per worker process: its leases (apps.runs.live), its presence key and its held hash.
# The random part makes a restarted process another worker even when its host name and pid
# repeat (a container's PID 1 after a restart), so its predecessor's hash is still recovered.
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def replica_id() -> str:
    """LOOMCYCLE_REPLICA_ID, else the host name: the replica this process belongs to."""
    return settings.LOOMCYCLE.replica_id or socket.gethostname()


def presence_value(*, kind: str, process_id: str, version: str) -> str:
    """What a presence key holds (JSON): the `replicas[]` entry of /healthz. No
    secret: ids, host name, times and version only."""
    return json.dumps(
        {
            "id": process_id,
            "kind": kind,
            "replica_id": replica_id(),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "started_at": STARTED_AT,
            "last_heartbeat_at": time.time(),
            "version": version,
        }
    )


def held_key(worker_id: str = WORKER_ID) -> str:
    return HELD_PREFIX + worker_id


def entry(raw: Any, exchange: str, routing_key: str) -> str:
    """What the hash keeps of a delivery: kombu's unacked-hash entry."""
    return str(dumps([raw, exchange, routing_key]))


def recover_dead(channel: Any, presence: Any) -> int:
    """Push back the doorbells held by workers whose presence key (in Redis
    client `presence`) has expired; `channel` is a channel of our transport.
    Returns how many were pushed back."""
    client = channel.client
    total = 0
    for key in list(client.scan_iter(HELD_PREFIX + "*")):
        worker = (key.decode() if isinstance(key, bytes) else str(key)).removeprefix(HELD_PREFIX)
        if presence.exists(PRESENCE_PREFIX + worker):
            continue
        # MULTI/EXEC: of several sweepers, exactly one reads the entries it deletes.
        with client.pipeline(transaction=True) as pipe:
            entries, _ = pipe.hvals(key).delete(key).execute()
        if not entries:
            continue
        with client.pipeline(transaction=False) as pipe:
            for raw in entries:
                message, exchange, routing_key = loads(raw)
                channel._do_restore_message(message, exchange, routing_key, pipe)  # to the front of its queue
            pipe.execute()
        log.warning("worker %s is gone: %d doorbell(s) it held are back in their queues", worker, len(entries))
        total += len(entries)
    return total
