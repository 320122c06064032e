"""Driving a host tool's run in this process (the extension tests)."""

from __future__ import annotations

from apps.runs import engine
from apps.runs.models import TERMINAL, Run


def drive(run: Run) -> Run:
    """Run the engine here, step by step, until the run is terminal."""
    step = 0
    while (row := Run.objects.get(id=run.id)).status not in TERMINAL:
        engine.run_iterate(run_id=run.id, step=step)
        step = Run.objects.get(id=run.id).step
        assert step < 10, "the run did not finish"
    return row
