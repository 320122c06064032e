"""Seeing, from a test, that a worker's statement waits for a row lock the test holds."""

from __future__ import annotations

from django.db import connection

# pg_stat_activity keeps a query's first 1 kB, so a statement is known by the CTE
# that updates the run (`c` is the claim, `r` the step commit, apps.runs.store).
_WAITING = r"""
SELECT count(*) FROM pg_stat_activity
WHERE wait_event_type = 'Lock' AND query ~ ('\s' || %s || ' AS \(\s+UPDATE runs_run SET')
"""


def run_updates_waiting(cte: str) -> int:
    """How many statements whose CTE `cte` updates runs_run wait for a lock now."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")  # pg_stat_activity is otherwise frozen per transaction
        cur.execute(_WAITING, [cte])
        return int(cur.fetchone()[0])
