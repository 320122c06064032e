"""A receiver of the runtime's `run_finished` signal: it records each finished run."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from examples.hostapp.models import FinishedRun
from loomcycle_project.extend import signals


@receiver(signals.run_finished)
def record_finished_run(sender: Any, *, run_id: str, status: str, **kwargs: Any) -> None:
    FinishedRun.objects.create(run_id=run_id, status=status)
