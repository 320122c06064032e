"""An iteration that loses its database connection (a Postgres restart, a failover, a
terminated backend) hands its claim back: the lease is released at once, the attempt is
not counted, and the step's doorbell rings again, so a Postgres restart costs a run no
share of LOOMCYCLE_MAX_ATTEMPTS (the limit on lost workers) and no wait for its lease.
Past engine.HAND_BACKS_FREE hand-backs of one step the attempts count, so a step that
takes the database down every time still ends as a poison iteration.

The engine runs in this process (`no_workers`), with the scripted agent's Memory tool
replaced by one whose own connection is terminated, as a restart terminates it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from django.conf import settings

from apps.core import toolregistry as registry
from apps.core.redis import sync_client
from apps.core.tools import Tool, ToolContext, ToolResult
from apps.runs import engine
from apps.runs.models import Run, RunEvent, RunStatus, ToolCallRecord
from loomcycle_project.extend import run_create
from workers.queues import RUNS

pytestmark = pytest.mark.usefixtures("agents", "no_workers")

SCRIPT = "MOCK_SCRIPT: " + json.dumps(
    [{"tool": "Memory", "input": {"op": "get", "scope": "agent", "key": "k"}}, {"text": "done"}]
)


@dataclass
class Flaky:
    """Memory's stand-in: loses its connection on the first `losses` calls, then answers."""

    losses: int
    calls: int = 0

    def __call__(self, ctx: ToolContext, data: dict[str, Any]) -> ToolResult:
        self.calls += 1
        if self.calls <= self.losses:
            with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as own:
                with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as admin:
                    admin.execute("SELECT pg_terminate_backend(%s)", (own.info.backend_pid,))
                own.execute("SELECT 1")  # raises: the server closed the connection
        return ToolResult("no value")


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> Iterator[Flaky]:
    flaky = Flaky(losses=0)
    real = registry._REGISTRY["Memory"]
    monkeypatch.setitem(registry._REGISTRY, "Memory", Tool("Memory", real.description, real.input_schema, flaky))
    yield flaky


def row(run_id: str) -> Run:
    return Run.objects.get(id=run_id)


def test_a_lost_connection_hands_the_claim_back_without_an_attempt_and_rings_again(memory: Flaky) -> None:
    memory.losses = 1
    run = run_create(agent="scripted", prompt=SCRIPT)
    queued = sync_client().llen(RUNS)
    token = row(run.id).lease_token
    assert engine.run_iterate(run_id=run.id, step=0) == engine.Outcome.HANDED_BACK
    after = row(run.id)
    assert (after.step, after.status, after.attempts) == (0, RunStatus.RUNNING, 0)
    assert (after.lease_owner, after.lease_until) == ("", None)  # released, not left to expire
    assert after.lease_token == token + 2  # the claim's token and the hand-back's: a late commit is fenced
    assert sync_client().llen(RUNS) == queued + 1  # the step's doorbell rang again
    assert engine.run_iterate(run_id=run.id, step=0) == engine.Outcome.REQUEUE  # the tool runs again, and answers
    assert engine.run_iterate(run_id=run.id, step=1) == engine.Outcome.FINISH
    done = row(run.id)
    assert (done.status, done.attempts, memory.calls) == (RunStatus.COMPLETED, 0, 2)
    calls = ToolCallRecord.objects.filter(run_id=run.id)
    assert [(c.name, c.status, c.is_error) for c in calls] == [("Memory", "finished", False)]
    seqs = list(RunEvent.objects.filter(run_id=run.id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_step_that_loses_the_database_every_time_still_ends_as_a_poison_iteration(memory: Flaky) -> None:
    memory.losses = 1_000
    run = run_create(agent="scripted", prompt=SCRIPT)
    free, limit = engine.HAND_BACKS_FREE, settings.LOOMCYCLE.max_attempts
    outcomes = [engine.run_iterate(run_id=run.id, step=0) for _ in range(free)]
    assert outcomes == [engine.Outcome.HANDED_BACK] * free and row(run.id).attempts == 0
    outcomes = [engine.run_iterate(run_id=run.id, step=0) for _ in range(limit)]
    assert outcomes == [engine.Outcome.HANDED_BACK] * limit and row(run.id).attempts == limit  # now they count
    assert engine.run_iterate(run_id=run.id, step=0) == engine.Outcome.FINISH
    failed = row(run.id)
    assert failed.status == RunStatus.FAILED and f"giving up after {limit} attempts" in failed.error
    assert memory.calls == free + limit
