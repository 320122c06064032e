"""The turn-cancel flag of an interactive run (part of apps/runs/store/, the one
package that writes the runs app's tables). Set here by the API's request, read
by the iteration that runs the turn (apps.runs.engine.turncancel), cleared by the step
commit that parks the run for input (store.hot's commit)."""

from __future__ import annotations

from django.db import connection

from apps.runs.statuses import RUNNABLE
from apps.runs.store.append import _in

# Compare-and-set on the status: a run parked for input (or anywhere else) has no turn to stop,
# and a step commit that parks it races this UPDATE on the row lock, never past it.
_TURN_CANCEL_SQL = f"""
UPDATE runs_run SET turn_cancel_requested = true, turn_cancel_reason = %s, updated_at = now()
WHERE id = %s AND interactive AND status IN ({_in(RUNNABLE)})
RETURNING id
"""


def turn_cancel_request(*, run_id: str, reason: str) -> bool:
    """Flag the current turn of a runnable interactive run for cancel (the reason
    given already redacted); False when the run is not mid-turn (nothing written)."""
    with connection.cursor() as cur:
        cur.execute(_TURN_CANCEL_SQL, [reason, run_id])
        row = cur.fetchone()
    return row is not None
