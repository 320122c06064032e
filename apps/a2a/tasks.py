"""Thin Celery adapters over apps.a2a.calls. Invariant: `calls_due` claims each due call by a
compare-and-set, so overlapping ticks ask a peer once per poll period."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from apps.a2a import calls, push
from workers.base import AgentTask


@shared_task(base=AgentTask, name="maintenance.a2a_calls_due")
def a2a_calls_due_task(**_: Any) -> int:
    """Ask the peers of due A2A calls; answer the settled, cancel the abandoned."""
    return calls.calls_due()


@shared_task(base=AgentTask, name="maintenance.a2a_push_deliver")
def a2a_push_deliver_task(*, run_id: str, **_: Any) -> int:
    """POST an ended A2A task to its push-notification configs (once each)."""
    return push.deliver(run_id)
