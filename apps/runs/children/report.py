"""A child's report to its parent (SPEC 6.4). Invariants:
- a child reports exactly once: a conditional UPDATE flips `reported_to_parent` on
  the child, in the transaction that appends the `tool_result` to the parent
  (`apps.runs.wake.run_answer`). The last pending answer flips the parent back to
  `running` and rings its doorbell on commit;
- a fan-out child reports to its join instead (apps.runs.children.fanout);
- the report follows the child's end (apps.runs.lifecycle subscribes `on_run_ended`);
  a report lost to a crash is made by the sweeper (`children_report_sweep`).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from apps.runs import store
from apps.runs.children import fanout
from apps.runs.lifecycle import Ended
from apps.runs.models import TERMINAL, Run, RunStatus, TranscriptEntry
from apps.runs.wake import run_answer

log = logging.getLogger("loomcycle.subruns")


def _child_result(child: Run) -> tuple[str, bool]:
    if child.status == RunStatus.COMPLETED:
        last = (
            TranscriptEntry.objects.filter(run_id=child.id, role="assistant")
            .order_by("-idx")
            .values_list("content", flat=True)
            .first()
        )
        text = "".join(b.get("text", "") for b in (last or []) if b.get("type") == "text")
        return f"[sub-agent agent_id={child.agent_id}]\n{text}", False
    why = child.error or child.stop_reason or child.status
    return f"[sub-agent agent_id={child.agent_id}] {child.status}: {why}", True


def on_run_ended(ended: Ended) -> None:
    """apps.runs.lifecycle subscriber (children): the child reports to its parent."""
    run_child_finished(child_id=ended.run_id)


def run_child_finished(*, child_id: str) -> bool:
    """Report a terminal child to its parent, exactly once. False if nothing to do."""
    fanout_id = fanout.fanout_of(child_id)
    if fanout_id is not None:  # a parallel_spawn or runs:batch child: its join answers (apps.runs.children.fanout)
        return fanout.fanout_child_finished(child_id=child_id, fanout_id=fanout_id)
    with transaction.atomic():
        # Compare-and-set: only the first report of this child proceeds.
        if not store.child_report_claim(child_id=child_id):
            return False
        child = Run.objects.get(id=child_id)
        text, is_error = _child_result(child)
        run_answer(
            run_id=str(child.parent_id), call_id=child.parent_call_id, tool_name="Agent", text=text, is_error=is_error
        )
    return True


def children_report_sweep(*, settle_seconds: float = 2.0) -> int:
    """Children that ended but whose report was lost (a crash between their
    commit and the report)."""
    cutoff = timezone.now() - timedelta(seconds=settle_seconds)
    ids = list(
        Run.objects.filter(
            parent__isnull=False, reported_to_parent=False, status__in=TERMINAL, completed_at__lt=cutoff
        ).values_list("id", flat=True)[:500]
    )
    reported = sum(run_child_finished(child_id=i) for i in ids)
    reported += fanout.batch_report_sweep(settle_seconds=settle_seconds)  # runs:batch children have no parent
    if reported:
        log.info("sweeper reported %d finished child run(s) to their parents", reported)
    return reported
