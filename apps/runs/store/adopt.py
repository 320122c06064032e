"""The read that adopts an armed lease (part of apps/runs/store/; docs/architecture.md,
"Lease adoption").

A step commit that rings the run's next step itself arms that step's lease
(apps.runs.store.hot: the next token, `lease_until` a lease ahead, no owner, the
attempt counted) and its doorbell carries the token. The worker that wins the
doorbell's Redis key (apps.runs.engine.adopt) adopts the lease by reading the run
here: ONE plain SELECT, no write and no transaction id, of what the claim returns.
The step commit's fence (step, lease_token) is what makes the adopter's commit
the only one; the heartbeat names it the lease's owner (store.leases_extend).
"""

from __future__ import annotations

from django.conf import settings

from apps.core.spend import LIMITS_GENERATION_SQL
from apps.runs.statuses import RUNNABLE, RuntimeStateValue
from apps.runs.store.append import _in
from apps.runs.store.hot import _CLAIM_COLUMNS, ClaimedRun, _hot, claimed_of

# Armed for this very token and step, still unowned, and alive for longer than a
# heartbeat period, so the adopter's first beat extends it before it can expire (a
# doorbell that waited longer than that takes the compare-and-set claim instead).
_ADOPT_SQL = f"""
SELECT {", ".join(f"r.{col}" for col in _CLAIM_COLUMNS)}, false, {LIMITS_GENERATION_SQL},
  COALESCE((SELECT state FROM runs_runtimestate WHERE id = 1), '{RuntimeStateValue.RUNNING.value}'),
  (SELECT COALESCE(json_agg(json_build_array(t.role, t.content) ORDER BY t.idx), '[]')
   FROM runs_transcriptentry t WHERE t.run_id = r.id)
FROM runs_run r
WHERE r.id = %(id)s AND r.step = %(step)s AND r.lease_token = %(token)s AND r.lease_owner = ''
  AND r.lease_until > now() + make_interval(secs => %(margin)s) AND r.status IN ({_in(RUNNABLE)})
"""


def adopt(*, run_id: str, step: int, token: int) -> ClaimedRun | None:
    """The run whose armed lease (step, token) this worker adopts; None when it is
    not armed so (a stale doorbell, an adopted or expired lease, one about to expire)."""
    params = {"id": run_id, "step": step, "token": token, "margin": settings.LOOMCYCLE.heartbeat_seconds}
    row = _hot(_ADOPT_SQL, params)
    return None if row is None else claimed_of(row)
