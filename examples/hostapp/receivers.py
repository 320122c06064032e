"""A receiver of the runtime's `run_finished` signal: it records each finished run once.

The signal is delivered at least once (a re-send after a crash carries the same
`delivery_id`), so the row is keyed by `delivery_id`: a duplicate finds it and adds nothing."""

from __future__ import annotations

from typing import Any

from django.dispatch import receiver

from examples.hostapp.models import FinishedRun
from loomcycle_project.extend import signals


@receiver(signals.run_finished)
def record_finished_run(sender: Any, *, run_id: str, status: str, delivery_id: int, **kwargs: Any) -> None:
    FinishedRun.objects.get_or_create(delivery_id=delivery_id, defaults={"run_id": run_id, "status": status})
