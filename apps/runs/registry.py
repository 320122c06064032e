"""When a run ends: the listeners apps register to hear it.

The tools, their policy, interceptors, providers and volume resolver are apps/core/toolregistry.py
(the floor every app's tools stand on); this module keeps only the run's end, which is runs'.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("loomcycle.runs")

# --- "run finished" listeners ------------------------------------------------------------
# Apps that want to hear when a run ends (apps.triggers' on_complete hooks; apps.tools purges
# a top-level run's ephemeral volumes) register here from AppConfig.ready(), as tools do: the
# engine never imports them. Only runs created with `notify_finished` are announced (a
# trigger's run, a top-level run with an ephemeral volume), so other runs pay nothing for it.

RunFinished = Callable[[str, str], None]  # (run_id, terminal status)
_FINISHED: list[RunFinished] = []


def on_run_finished(listener: RunFinished) -> None:
    """Call `listener(run_id, status)` after a notify_finished run's terminal step commits
    (at most once per run from the engine; a listener must itself tolerate a second call)."""
    if listener not in _FINISHED:
        _FINISHED.append(listener)


def run_finished(run_id: str, status: str) -> None:
    """Tell every listener; one listener's failure is logged and does not stop the others."""
    for listener in list(_FINISHED):
        try:
            listener(run_id, status)
        except Exception:  # a listener's bug must not fail the run's (committed) iteration
            log.exception(
                "run %s: a run-finished listener (%s) failed", run_id, getattr(listener, "__name__", listener)
            )
