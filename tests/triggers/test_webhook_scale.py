"""Durable dedupe under load: 1,000 deliveries, 20 % of them duplicates,
sent concurrently to TWO web processes. Exactly one run per delivery id, and
every copy answers with that run's id: the copies meet at the unique index
of the delivery row inserted with the run, not in any process's memory."""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.runs.models import Run
from apps.triggers.webhooks.models import Verdict, WebhookDelivery
from tests.conftest import daphne, wait_for
from tests.triggers.conftest import WEB_ENV, define, github, payload

pytestmark = pytest.mark.usefixtures("agents")

TOTAL, DUPLICATE_SHARE, CONCURRENCY = 1000, 0.2, 64


def deliveries(seed: int = 19) -> list[tuple[str, bytes]]:
    """800 distinct ids and 200 copies of ids among them, shuffled: a copy may go out before its original."""
    rng = random.Random(seed)
    unique = int(TOTAL * (1 - DUPLICATE_SHARE))
    originals = [(f"dlv-{i}", payload(n=i)) for i in range(unique)]
    copies = [rng.choice(originals) for _ in range(TOTAL - unique)]
    out = originals + copies
    rng.shuffle(out)
    return out


async def send_all(bases: list[str], batch: list[tuple[str, bytes]]) -> list[tuple[str, int, dict[str, Any]]]:
    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(i: int, delivery_id: str, body: bytes) -> tuple[str, int, dict[str, Any]]:
            async with gate:
                headers = {**github(body), "X-Delivery": delivery_id}
                resp = await client.post(f"{bases[i % 2]}/v1/_webhooks/burst", content=body, headers=headers)
                return delivery_id, resp.status_code, resp.json()

        return await asyncio.gather(*(one(i, d, b) for i, (d, b) in enumerate(batch)))


def test_duplicates_across_two_web_processes_make_exactly_one_run_each(hook_webs: list[str], stack: Any) -> None:
    auth = {"signing_secret_env": "LOOMCYCLE_WH_SECRET", "delivery_id_header": "X-Delivery"}
    define("burst", auth=auth, rate_limit={"requests_per_minute": 600_000, "burst": 5000})
    batch = deliveries()
    answers = asyncio.run(send_all(hook_webs, batch))

    runs_by_id: dict[str, set[str]] = defaultdict(set)
    for delivery_id, status, body in answers:
        assert status in (200, 202), body
        assert (status == 200) == (body.get("deduped") == "true")
        runs_by_id[delivery_id].add(body["run_id"])
    assert len(runs_by_id) == 800
    assert all(len(run_ids) == 1 for run_ids in runs_by_id.values())  # every copy names the first run
    assert sum(1 for _, status, _ in answers if status == 202) == 800

    created = {r for run_ids in runs_by_id.values() for r in run_ids}
    assert Run.objects.filter(agent_name="echo").count() == 800
    assert set(Run.objects.filter(agent_name="echo").values_list("id", flat=True)) == created
    firsts = WebhookDelivery.objects.filter(webhook_name="burst", first=True)
    assert firsts.count() == 800 and set(firsts.values_list("run_id", flat=True)) == created
    assert WebhookDelivery.objects.filter(webhook_name="burst", verdict=Verdict.ACCEPTED_REPLAY).count() == 200
    wait_for(lambda: Run.objects.filter(agent_name="echo", status="completed").count() == 800, timeout=180)


async def copies(bases: list[str], body: bytes, headers: dict[str, str], n: int) -> list[tuple[int, dict[str, Any]]]:
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> tuple[int, dict[str, Any]]:
            resp = await client.post(f"{bases[i % 2]}/v1/_webhooks/racing", content=body, headers=headers)
            return resp.status_code, resp.json()

        return await asyncio.gather(*(one(i) for i in range(n)))


def test_simultaneous_copies_of_one_delivery_race_on_the_index(hook_webs: list[str], stack: Any) -> None:
    auth = {"signing_secret_env": "LOOMCYCLE_WH_SECRET", "delivery_id_header": "X-Delivery"}
    define("racing", auth=auth, rate_limit={"requests_per_minute": 6000, "burst": 100})
    body = payload(n=1)
    answers = asyncio.run(copies(hook_webs, body, {**github(body), "X-Delivery": "same"}, 24))
    assert sorted(status for status, _ in answers) == [200] * 23 + [202]
    assert len({out["run_id"] for _, out in answers}) == 1
    assert Run.objects.filter(id=answers[0][1]["run_id"]).count() == 1
    assert WebhookDelivery.objects.filter(webhook_name="racing", first=True).count() == 1


async def sync_deliveries(base: str, n: int) -> list[int]:
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as client:

        async def one(i: int) -> int:
            body = payload(n=i)
            resp = await client.post(f"{base}/v1/_webhooks/sync-many?sync=true", content=body, headers=github(body))
            return resp.status_code

        return await asyncio.gather(*(one(i) for i in range(n)))


@pytest.fixture(scope="module")
def two_thread_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """A receiver whose thread pool is 2 threads whatever the CPU count (daphne reads ASGI_THREADS)."""
    with daphne(stack_env, logdir, "daphne-webhooks-2-threads", **WEB_ENV, ASGI_THREADS="2") as base:
        yield base


def test_sync_waits_hold_no_thread(two_thread_web: str, stack: Any) -> None:
    """30 sync deliveries wait at once on a web process with 2 pool threads:
    if each wait held a thread, the 1 s waits would take at least 15 s; on
    the event loop they overlap."""
    define(
        "sync-many",
        agent="slow",
        sync_response={"enabled": True, "timeout_ms": 1000},
        rate_limit={"requests_per_minute": 6000, "burst": 100},
    )
    started = time.monotonic()
    statuses = asyncio.run(sync_deliveries(two_thread_web, 30))
    elapsed = time.monotonic() - started
    assert statuses == [504] * 30
    assert elapsed < 4.5, f"30 sync waits of 1 s took {elapsed:.1f} s: they did not overlap"
