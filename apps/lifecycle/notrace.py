"""No-trace runs: a top-level run whose request or agent says `retention: no_trace` is created
with `notify_finished` (apps.runs.create), so its end reaches `on_run_finished` here, which
deletes its tree at once. An agent under a RetentionOverride (set over the RetentionOverride
RPC, at most 24 h) is stored instead: the run's mark is cleared and the tenant's age applies.
A listener lost with its process (or a failed delete) leaves the run to beat's retention
sweep, which deletes ended no-trace trees first (apps.lifecycle.retention)."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.utils import timezone

from apps.lifecycle.models import RetentionOverride
from apps.runs import deletion, retention

log = logging.getLogger("loomcycle.lifecycle")


def override_active(*, tenant_id: str, agent_name: str) -> bool:
    return RetentionOverride.objects.filter(
        tenant_id=tenant_id, agent_name=agent_name, until__gt=timezone.now()
    ).exists()


def no_trace_settle(*, run_id: str) -> bool:
    """Delete the ended no-trace tree at `run_id` unless an override stores it; True when
    the tree is gone. A no-op for any other run."""
    root = retention.no_trace_root(run_id=run_id)
    if root is None:
        return False
    if override_active(tenant_id=root.tenant_id, agent_name=root.agent_name):
        retention.retention_clear(run_id=run_id)
        return False
    return deletion.tree_delete(root_id=run_id).deleted_runs > 0


def on_run_finished(run_id: str, status: str) -> None:
    """apps.runs.registry listener (every notify_finished run's end)."""
    try:
        no_trace_settle(run_id=run_id)
    except DatabaseError:
        log.exception("no-trace run %s ended; deleting its tree failed, the retention sweep will", run_id)
