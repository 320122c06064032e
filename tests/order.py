"""The order `make test` hands modules to its xdist workers: the longest first.

`--dist loadfile` gives each worker one module at a time, in the order it is handed them
(the Makefile turns off xdist's own reorder, which sorts by the number of tests and so put
the few-test, minute-long modules last). A long module handed out last runs alone on one
worker while the other has nothing left: handing out the longest first (the classic
longest-processing-time rule) leaves only short modules for the end.

SLOWEST lists the modules that took 45 s or more of test time in a full run with
`--durations=0` (2026-11-29), longest first; a stale or missing entry only loses a little
balance, never a test. Every other module keeps its collection order after them.
"""

from __future__ import annotations

import pytest

SLOWEST = (
    "tests/testing_kit/test_plugin.py",
    "tests/core/test_wheels.py",
    "tests/core/test_up.py",
    "tests/gateway/test_fairness.py",
    "tests/runs/test_engine.py",
    "tests/runs/test_fanout.py",
    "tests/triggers/test_schedule_versions.py",
    "tests/triggers/test_schedules.py",
    "tests/core/test_instance_defaults.py",
    "tests/channels/test_scale.py",
    "tests/runs/test_live_tokens.py",
    "tests/core/test_presets.py",
    "tests/core/test_healthcheck.py",
    "tests/runs/test_admin_browser.py",
    "tests/console/test_signin.py",
    "tests/chaos/test_infra_restarts.py",
    "tests/grpcapi/test_runs.py",
    "tests/triggers/test_beat.py",
    "tests/triggers/test_hooks.py",
    "tests/runs/test_backpressure.py",
    "tests/console/test_schedules_ops.py",
    "tests/triggers/test_webhook_records.py",
    "tests/lifecycle/test_retention.py",
    "tests/snapshots/test_restore_checks.py",
)
_RANK = {module: rank for rank, module in enumerate(SLOWEST)}


def longest_first(items: list[pytest.Item]) -> None:
    """Reorder `items` in place: SLOWEST's modules first, in its order; a module's own tests keep
    their order, and so does every other module (the sort is stable)."""
    items.sort(key=lambda item: _RANK.get(item.nodeid.split("::", 1)[0], len(_RANK)))
