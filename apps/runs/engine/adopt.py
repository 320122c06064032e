"""Lease adoption: how a doorbell that carries an armed token takes its step without a
write of its own (docs/architecture.md, "Lease adoption").

The step commit that rings the run's next step arms that step's lease (the next
token, `lease_until` a lease ahead, no owner) and the doorbell carries the token.
Its worker adopts it with one Redis `SET NX PX <lease>` on (run, step, token) (a
duplicate doorbell loses it: NOOP) and one plain SELECT of the run
(apps.runs.store.adopt: no write). When Redis does not answer, or the SELECT finds
the lease about to expire, the compare-and-set claim takes the armed lease instead:
Redis trouble costs a commit, never liveness. Exactly one step commit lands either
way, because the commit is fenced on (step, lease_token) as after a claim.
"""

from __future__ import annotations

import logging

from django.conf import settings
from redis.exceptions import RedisError

from apps.core.redis import sync_client
from apps.runs import store
from apps.runs.store import ClaimedRun

log = logging.getLogger("loomcycle.engine")


def adopt_key(run_id: str, step: int, token: int) -> str:
    return f"lc:adopt:{run_id}:{step}:{token}"


class Claim:
    """The lease this delivery may take: `CLAIM` (compare-and-set) unless adopted."""


CLAIM = Claim()


def adopt(run_id: str, step: int, token: int) -> ClaimedRun | Claim | None:
    """The adopted run; None when a duplicate of this doorbell adopted it (the key is
    taken); `CLAIM` when the delivery must take the compare-and-set claim instead
    (Redis did not answer, or the lease is no longer armed for adoption: a claim
    takes an armed lease only while no worker owns it, and otherwise finds nothing)."""
    lease_ms = int(settings.LOOMCYCLE.lease_seconds * 1000)
    try:
        won = sync_client().set(adopt_key(run_id, step, token), "1", nx=True, px=lease_ms)
    except RedisError as exc:
        log.warning("run %s step %s: adoption key not set (%s); claiming in Postgres", run_id, step, exc)
        return CLAIM
    if not won:
        return None
    run = store.adopt(run_id=run_id, step=step, token=token)
    return CLAIM if run is None else run
