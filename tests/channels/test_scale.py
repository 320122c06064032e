"""1,000 runs parked on `subscribe` hold no worker; one publish to each of
half of them wakes each exactly once; the deadline wakes the rest with an
empty result (real workers, beat, Daphne, Postgres, Redis)."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.db import connection
from django.db.models import Count

from apps.channels import services
from apps.channels.models import ChannelWait
from apps.channels.streams import Stream
from apps.core.types import Principal
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.runs.services import RunCreate, run_create
from apps.substrate.models import ChannelDef
from tests.conftest import wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents")

RUNS = 1000
WAIT_MS = 45_000  # long enough for every run to park and half of them to be published to
OPERATOR = Principal(tenant_id="", subject="test", scopes=frozenset({"substrate:admin"}))


def _users() -> list[str]:
    return [f"u{i:04d}" for i in range(RUNS)]


def _create(users: list[str]) -> dict[str, str]:
    """Through the run service (what POST /v1/runs calls): this test is about
    parking at scale; the HTTP admission path has its own tests."""

    def start(user: str) -> tuple[str, str]:
        try:
            data = RunCreate(agent="inbox-waiter", segments=[Segment(text="wait")], user_id=user)
            return user, run_create(principal=OPERATOR, data=data).id
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(start, users))


def _publish(users: list[str]) -> None:
    declared = ChannelDef.objects.get(name="inbox", tenant_id="")

    def one(user: str) -> None:
        try:
            services.publish(stream=Stream("", "inbox", "user", user), declared=declared, value={"for": user})
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(one, users))


def _parked() -> int:
    return int(Run.objects.filter(agent_name="inbox-waiter", status=RunStatus.WAITING_CHANNEL).count())


def test_a_thousand_parked_subscribers(http: httpx.Client, stack: Any) -> None:
    tool_input = {"op": "subscribe", "channel": "inbox", "wait_ms": WAIT_MS}
    model = "mock-tool-loop?tool=Channel&calls=1&latency_ms=0&input=" + quote(json.dumps(tool_input))
    overlay = {"provider": "mock", "model": model, "tools": ["Channel"], "channels": {"subscribe": ["inbox"]}}
    assert http.post("/v1/_agentdef", json={"op": "create", "name": "inbox-waiter", "overlay": overlay}).is_success

    users = _users()
    started = time.monotonic()
    runs = _create(users)
    created = time.monotonic() - started
    try:
        wait_for(lambda: _parked() == RUNS, timeout=120, interval=0.5)
    except AssertionError:
        by_status = dict(Run.objects.filter(agent_name="inbox-waiter").values_list("status").annotate(n=Count("id")))
        elapsed = time.monotonic() - started
        raise AssertionError(f"created in {created:.1f} s; after {elapsed:.1f} s: {by_status}") from None
    print(f"1000 runs created in {created:.1f} s, all parked after {time.monotonic() - started:.1f} s")
    # Parked runs hold nothing: no lease, one wait row each, and the workers are free for new work.
    assert not Run.objects.filter(agent_name="inbox-waiter", lease_until__isnull=False).exists()
    assert ChannelWait.objects.count() == RUNS
    echo = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "background": True}).json()
    wait_status(echo["run_id"], RunStatus.COMPLETED, timeout=15)
    assert len(stack.pids()) == 2

    published, deadline_group = users[RUNS // 2 :], users[: RUNS // 2]  # the later half parked last
    _publish(published)
    for user in published:
        wait_status(runs[user], RunStatus.COMPLETED, timeout=60)
    # The publishes woke only their own subscribers: the deadline group's answers are
    # empty (checked below). On a slow host the first of them may already have timed
    # out by now, so only an upper bound holds for the count still parked.
    assert _parked() <= RUNS // 2
    for user in deadline_group:
        wait_status(runs[user], RunStatus.COMPLETED, timeout=WAIT_MS / 1000 + 60)

    results = {e.run_id: e.payload for e in RunEvent.objects.filter(run__agent_name="inbox-waiter", type="tool_result")}
    counts = RunEvent.objects.filter(run__agent_name="inbox-waiter", type="tool_result").values_list(
        "run_id", flat=True
    )
    assert len(list(counts)) == RUNS  # exactly one answer per run
    for user in published:
        out = json.loads(results[runs[user]]["text"])
        assert [m["value"] for m in out["messages"]] == [{"for": user}]
    for user in deadline_group:
        assert json.loads(results[runs[user]]["text"]) == {"channel": "inbox", "messages": [], "next_cursor": ""}
    assert not ChannelWait.objects.exists()
