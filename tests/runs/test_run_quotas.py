"""Fan-out cannot escape the run caps (issue 33, item 6): every descendant of a
run (op=spawn sub-agent, parallel_spawn child) holds a slot in its root's
tenant and user sets, as a top-level run does, from the moment its parent's
call plans it until it ends; a child over a cap is refused in its parent's tool
result, never parked on a sleeping worker. Real workers run the parents and
children with the caps in their environment; the caps reach this process
through the `settings` fixture."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apps.core.redis import sync_client
from apps.gateway.fairness.config import PREFIX, RUNS_KEY
from apps.runs import services
from apps.runs.children import batch
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from tests import procs
from tests.conftest import ALICE, wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents")

TENANT_CAP, USER_CAP = 3, 2
CAPS_ENV = {
    "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT": str(TENANT_CAP),
    "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER": str(USER_CAP),
}


def _clean() -> None:
    for key in sync_client().scan_iter(match=PREFIX + "*", count=1000):
        sync_client().delete(key)


@pytest.fixture(scope="module")
def capped_pool(workers: procs.WorkerPool, stack_env: dict[str, str], logdir: Path) -> Iterator[procs.WorkerPool]:
    """Workers with the caps in their environment; the session's (caps off) are stopped meanwhile."""
    workers.stop()
    pool = procs.WorkerPool({**stack_env, **CAPS_ENV}, logdir / "run-quotas")
    pool.ensure()
    try:
        yield pool
    finally:
        pool.stop()
        workers.ensure()


@pytest.fixture(autouse=True)
def caps(settings: Any) -> Iterator[None]:
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, max_concurrent_runs_per_tenant=TENANT_CAP, max_concurrent_runs_per_user=USER_CAP
    )
    _clean()
    yield
    _clean()


def tenant_held(tenant: str = "") -> int:
    return int(sync_client().zcard(f"{PREFIX}t:{tenant}"))


def script(steps: list[dict[str, Any]]) -> str:
    return f"MOCK_SCRIPT: {json.dumps(steps)}"


def start(agent: str, prompt: str, user_id: str) -> Run:
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], user_id=user_id)
    return services.run_create(principal=ALICE, data=data)


def agent_results(run_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")]


def test_parallel_spawn_children_past_the_tenant_cap_are_refused_entries(capped_pool: procs.WorkerPool) -> None:
    """Tenant cap 3: the parent holds one slot, its first two children the others; the
    third and fourth are refused in the envelope (no child row), and every slot comes back."""
    spawns = [{"name": "fan-child", "prompt": script([{"text": f"r{i}", "sleep_ms": 300}])} for i in range(4)]
    steps = [{"tool": "Agent", "input": {"op": "parallel_spawn", "spawns": spawns}}, {"text": "done"}]
    parent = start("fanner-wide", script(steps), user_id="")  # no user: only the tenant cap applies
    done = wait_status(parent.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=40)
    assert done.status == RunStatus.COMPLETED
    [result] = agent_results(parent.id)
    entries = json.loads(str(result["text"]))["results"]
    assert [e["ok"] for e in entries] == [True, True, False, False]
    for refused in entries[2:]:
        assert "per-tenant quota exhausted" in refused["error"] and f"cap={TENANT_CAP}" in refused["error"]
    assert Run.objects.filter(parent_id=parent.id).count() == 2
    wait_for(lambda: tenant_held() == 0 and sync_client().hlen(RUNS_KEY) == 0, timeout=10)


def test_a_sub_agent_past_its_roots_user_cap_is_a_tool_error_to_its_parent(capped_pool: procs.WorkerPool) -> None:
    """User cap 2: the recursor (root) and its child hold both slots; the grandchild the
    child spawns is refused with the cap named, long before the depth limit (3)."""
    root = start("recursor", "go", user_id="u1")
    wait_status(root.id, RunStatus.COMPLETED, RunStatus.FAILED, timeout=40)
    child = Run.objects.get(parent_id=root.id)
    assert child.user_id == "u1" and not Run.objects.filter(parent_id=child.id).exists()
    [refusal] = [r for r in agent_results(child.id) if r["tool_use"]["name"] == "Agent"]
    assert refusal["is_error"] is True
    assert "per-user quota exhausted: user=u1 cap=2" in str(refusal["text"])
    wait_for(lambda: sync_client().hlen(RUNS_KEY) == 0, timeout=10)


def test_batch_items_count_against_the_tenant_cap(capped_pool: procs.WorkerPool) -> None:
    spawns = [
        batch.BatchSpawn(create=services.RunCreate(agent="echo", segments=[Segment(text=f"b{i}")], user_id=f"u{i}"))
        for i in range(TENANT_CAP + 1)
    ]
    fanout_id = batch.batch_start(principal=ALICE, spawns=spawns)
    body = wait_for(lambda: (b := batch.batch_result(fanout_id=fanout_id))["spawned"] == TENANT_CAP and b)
    [refused] = [r for r in body["results"] if not r["run_id"]]
    assert refused["error"].startswith("per_tenant_quota_exhausted")
    for entry in body["results"]:
        if entry["run_id"]:
            wait_status(entry["run_id"], RunStatus.COMPLETED)
    wait_for(lambda: tenant_held() == 0, timeout=10)
