"""Lease adoption (issue 43, docs/architecture.md "Lease adoption"): the step commit that rings
the run's next step arms that step's lease, the doorbell carries its token, and the worker it
reaches adopts the lease with a Redis SET NX and one plain SELECT, so a multi-iteration run
writes one claim and then one commit per iteration. A duplicate doorbell is a no-op, a lost
adopter's lease expires into the sweeper's claim, Redis refusing the SET costs a claim, and a
cancel between iterations still ends the run within a second."""

from __future__ import annotations

import base64
import json
import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from apps.core.redis import sync_client
from apps.runs import engine, live, services
from apps.runs.engine import iterate
from apps.runs.engine.adopt import adopt_key
from apps.runs.models import Run, RunStatus
from apps.runs.prompt import Segment
from tests.conftest import ALICE, run_row, wait_for, wait_status
from tests.factories.runs import assert_consecutive, event_types
from tests.procs import WorkerPool
from workers.queues import RUNS

pytestmark = pytest.mark.usefixtures("agents")

CONTEXT = {"tools": [{"tool": "Context", "input": {"op": "time"}}]}


def scripted(steps: list[dict[str, Any]]) -> Run:
    prompt = f"MOCK_SCRIPT: {json.dumps(steps)}"
    data = services.RunCreate(agent="scripted", segments=[Segment(text=prompt)])
    return services.run_create(principal=ALICE, data=data)


def doorbell(run_id: str) -> tuple[int, dict[str, Any]]:
    """The doorbell rung for `run_id` (step, kwargs), taken off the runs list (no worker reads it here)."""
    client = sync_client()
    for raw in client.lrange(RUNS, 0, -1):
        args, kwargs, _ = json.loads(base64.b64decode(json.loads(raw)["body"]))
        if args[0] == run_id:
            client.lrem(RUNS, 1, raw)
            return int(args[1]), kwargs
    raise AssertionError(f"no doorbell queued for {run_id}")


def xid() -> int:
    """The next transaction id (this probe takes one)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_current_xact_id()::text::bigint")
        return int(cur.fetchone()[0])


def count_beats(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """This process's lease heartbeats, each run in a transaction that tells whether it wrote
    (a beat that extends a lease takes a transaction id of its own)."""
    wrote: list[bool] = []
    real = live.leases_extend

    def beat(**kw: Any) -> None:
        with transaction.atomic():
            real(**kw)
            with connection.cursor() as cur:
                cur.execute("SELECT pg_current_xact_id_if_assigned() IS NOT NULL")
                wrote.append(bool(cur.fetchone()[0]))

    monkeypatch.setattr(live, "leases_extend", beat)
    return wrote


def test_a_multi_iteration_run_writes_one_claim_then_one_commit_per_iteration(
    no_workers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = scripted([CONTEXT] * 5 + [{"text": "done"}])
    beats = count_beats(monkeypatch)
    first = xid()
    outcomes, tokens = [], []
    for _ in range(5):  # steps 0-4 call a tool and ring the next step
        step, kwargs = doorbell(run.id)
        tokens.append(kwargs.get("token"))
        outcomes.append(engine.run_iterate(run_id=run.id, step=step, **kwargs))
        armed = run_row(run.id)
        assert (armed.lease_owner, armed.attempts) == ("", 1) and armed.lease_until is not None
    writes = xid() - first - 1 - sum(beats)
    assert outcomes == [engine.Outcome.REQUEUE] * 5
    assert tokens[0] is None  # run creation rings without a token: the first iteration claims
    assert tokens[1:] == [2, 3, 4, 5]  # the claim's token 1, then each commit arms the next
    assert writes == 1 + 5  # one claim and five step commits: the adoptions wrote nothing
    step, kwargs = doorbell(run.id)
    assert engine.run_iterate(run_id=run.id, step=step, **kwargs) == engine.Outcome.FINISH
    done = run_row(run.id)
    assert (done.status, done.step, done.lease_until, done.attempts) == (RunStatus.COMPLETED, 6, None, 0)
    assert event_types(run.id).count("tool_result") == 5
    assert_consecutive(run.id)


def test_redis_refusing_the_adoption_key_costs_a_claim_not_the_iteration(
    no_workers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = scripted([CONTEXT, {"text": "done"}])
    step, kwargs = doorbell(run.id)
    assert engine.run_iterate(run_id=run.id, step=step, **kwargs) == engine.Outcome.REQUEUE
    step, kwargs = doorbell(run.id)
    client = sync_client()
    limit = client.config_get("maxmemory")["maxmemory"]
    refusing = {"on": False}

    def refuse(on: bool) -> None:  # noeviction: at maxmemory 1 Redis refuses every write that may grow it (OOM)
        client.config_set("maxmemory", "1" if on else limit)
        refusing["on"] = on

    real_claim = iterate.store.claim

    def claim_then_redis_back(**kw: Any) -> Any:
        assert refusing["on"]  # the claim runs because the adoption's SET NX was refused
        try:
            return real_claim(**kw)
        finally:
            refuse(False)  # the rest of the iteration (its after-commit work) has its Redis back

    monkeypatch.setattr(iterate.store, "claim", claim_then_redis_back)
    refuse(True)
    try:
        assert engine.run_iterate(run_id=run.id, step=step, **kwargs) == engine.Outcome.FINISH
    finally:
        refuse(False)
    assert not client.exists(adopt_key(run.id, step, kwargs["token"]))
    done = run_row(run.id)
    # the claim took the armed lease: its token moved on
    assert (done.status, done.lease_token) == (RunStatus.COMPLETED, kwargs["token"] + 1)
    assert event_types(run.id).count("text") == 1
    assert_consecutive(run.id)


def test_a_duplicate_doorbell_is_a_noop_while_its_key_lives_and_after_the_heartbeat_named_the_owner(
    stack: WorkerPool,
) -> None:
    run = scripted([CONTEXT, {"text": "done", "sleep_ms": 9000}])

    def adopted() -> Run | None:
        row = run_row(run.id)
        return row if row.step == 1 and row.lease_owner else None

    row = wait_for(adopted, timeout=30)  # step 1 adopted on a worker, whose heartbeat named it the owner
    assert row.attempts == 1
    key = adopt_key(run.id, 1, row.lease_token)
    assert sync_client().exists(key)
    # the same doorbell again, delivered here: it loses the key
    assert engine.run_iterate(run_id=run.id, step=1, token=row.lease_token) == engine.Outcome.NOOP
    wait_for(lambda: not sync_client().exists(key), timeout=10)  # the key lives a lease (3 s)
    # after the key expired: it wins the key, but the lease has an owner now
    assert engine.run_iterate(run_id=run.id, step=1, token=row.lease_token) == engine.Outcome.NOOP
    assert sync_client().exists(key)
    assert run_row(run.id).lease_owner == row.lease_owner
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert done.attempts == 0 and event_types(run.id).count("text") == 1
    assert_consecutive(run.id)


def _owner_pid(run_id: str) -> int:
    owner = run_row(run_id).lease_owner
    return int(owner.split(":")[-2]) if owner else 0


def test_an_adopter_killed_mid_iteration_loses_the_lease_to_the_sweepers_claim_at_attempt_two(
    stack: WorkerPool,
) -> None:
    run = scripted([CONTEXT, {"text": "done", "sleep_ms": 4000}])
    row = wait_for(lambda: (r := run_row(run.id)).step == 1 and r.lease_owner and r, timeout=30)
    pid = _owner_pid(run.id)
    assert row.attempts == 1 and pid in stack.pids()  # adopted: the attempt was counted when it was armed
    stack.kill(pid)  # kill -9 inside the adopted iteration's provider call
    retried = wait_for(lambda: (r := run_row(run.id)).lease_token > row.lease_token and r.lease_owner and r, timeout=30)
    assert retried.attempts == 2 and _owner_pid(run.id) != pid  # the sweeper's re-ring claimed it
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=40)
    assert done.attempts == 0 and event_types(run.id).count("text") == 1
    assert_consecutive(run.id)


def test_a_cancel_between_iterations_ends_the_run_within_a_second(no_workers: None) -> None:
    run = scripted([CONTEXT, CONTEXT, {"text": "done"}])
    step, kwargs = doorbell(run.id)
    assert engine.run_iterate(run_id=run.id, step=step, **kwargs) == engine.Outcome.REQUEUE
    armed = run_row(run.id)
    assert armed.lease_until is not None and armed.lease_owner == ""  # armed for step 1, not adopted yet
    t0 = time.monotonic()
    services.run_cancel(principal=ALICE, run_id=run.id)  # no worker owns the lease: finished here, at once
    elapsed = time.monotonic() - t0
    done = run_row(run.id)
    assert (done.status, done.stop_reason, done.lease_until) == (RunStatus.CANCELLED, "cancelled by api", None)
    assert elapsed < 1.0, f"cancel took {elapsed:.2f} s"
    step, kwargs = doorbell(run.id)  # the armed doorbell, delivered after the cancel: nothing left to adopt
    assert engine.run_iterate(run_id=run.id, step=step, **kwargs) == engine.Outcome.NOOP
    assert event_types(run.id)[-1] == "done"
    assert_consecutive(run.id)


def test_a_cancel_between_iterations_on_workers_lands_within_a_second(stack: WorkerPool) -> None:
    run = scripted([{**CONTEXT, "sleep_ms": 300}] * 30 + [{"text": "done"}])
    wait_for(lambda: run_row(run.id).step >= 3, timeout=30)
    t0 = time.monotonic()
    services.run_cancel(principal=ALICE, run_id=run.id)
    wait_for(lambda: run_row(run.id).status == RunStatus.CANCELLED, timeout=5, interval=0.01)
    elapsed = time.monotonic() - t0
    assert elapsed < 1.0, f"cancel took {elapsed:.2f} s"
    assert_consecutive(run.id)


def test_a_duplicate_delivery_beside_the_iteration_in_one_process_leaves_its_heartbeat(no_workers: None) -> None:
    """A redelivered doorbell and the sweeper's re-ring can reach the process that runs the
    iteration: the duplicate's no-op must not take the iteration's lease out of the heartbeat."""
    run = scripted([{"text": "done", "sleep_ms": 5000}])  # longer than the 3 s lease
    step, kwargs = doorbell(run.id)
    outcome: list[engine.Outcome] = []
    worker = threading.Thread(target=lambda: outcome.append(engine.run_iterate(run_id=run.id, step=step, **kwargs)))
    worker.start()
    try:
        wait_for(lambda: run_row(run.id).lease_owner, timeout=10)
        assert engine.run_iterate(run_id=run.id, step=step) == engine.Outcome.NOOP  # the duplicate, in this process
        for _ in range(2):  # two beats after it (one may have been on its way already): the lease is still beaten
            beat = run_row(run.id).last_heartbeat_at
            wait_for(lambda beat=beat: run_row(run.id).last_heartbeat_at > beat, timeout=3)
    finally:
        worker.join(timeout=30)
    assert outcome == [engine.Outcome.FINISH]
    assert run_row(run.id).lease_token == 1  # claimed once: the lease never expired
