"""Task defaults for every loomcycle task (STYLE.md "The iteration task")."""

from __future__ import annotations

from celery import Task


class AgentTask(Task):  # type: ignore[type-arg]
    acks_late = True
    reject_on_worker_lost = True
    ignore_result = True
    # Engine failures are recorded on the run row; the broker never retries blindly.
    max_retries = 0
    time_limit = 1800
    soft_time_limit = 1700
