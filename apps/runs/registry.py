"""When a run ends: the door the other apps' ready() use to hear it.

The listeners live in apps.runs.lifecycle (the one fan-out of a run's end); these names
stay the door apps.tools and apps.triggers use (and `on_runs_deleted`, apps.runs.deletion's,
the door for rows about runs that a deleted run tree takes with it). Imported at call time: lifecycle imports the
run tables. The tools, their policy, interceptors, providers and volume resolver are
apps/core/toolregistry.py (the floor every app's tools stand on).
"""

from __future__ import annotations

from collections.abc import Callable

RunFinished = Callable[[str, str], None]  # (run_id, terminal status)


def on_run_finished(listener: RunFinished) -> None:
    """apps.runs.lifecycle.on_run_finished: `listener(run_id, status)` after a notify_finished run ends."""
    from apps.runs import lifecycle

    lifecycle.on_run_finished(listener)


def run_finished(run_id: str, status: str) -> None:
    """apps.runs.lifecycle.run_finished: tell every listener."""
    from apps.runs import lifecycle

    lifecycle.run_finished(run_id, status)


RunsDeleted = Callable[[str, list[str]], dict[str, int]]  # (tenant id, run ids) -> rows removed per table


def on_runs_deleted(listener: RunsDeleted) -> None:
    """apps.runs.deletion.on_runs_deleted: `listener(tenant_id, run_ids)` inside the transaction
    that deletes a run tree, for rows about runs that do not cascade from the run row."""
    from apps.runs import deletion

    deletion.on_runs_deleted(listener)
