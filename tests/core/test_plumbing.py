"""Process-level plumbing the hot paths rely on: the Celery app's Redis
transport reuses one client per channel and parses replies with hiredis; the
doorbell is Celery's own message, written with the wake-up in one round trip; agent
definitions are read once per process; the engine's statements are prepared,
other queries are not."""

from __future__ import annotations

import base64
import dataclasses
import json
import time
import uuid
from typing import Any

import pytest
from celery.signals import before_task_publish
from django.conf import settings
from django.db import connection, transaction
from kombu import Connection

from apps.core.redis import sync_client
from apps.runs import store
from apps.runs.dispatch import run_channel, wake_and_enqueue
from apps.substrate.selectors import agent_def_resolve, agent_definition
from tests.conftest import fast_transport, needs_fast_transport
from workers import doorbell
from workers.celery import app
from workers.queues import ITERATE_TASK
from workers.transport import Transport


@needs_fast_transport
def test_the_redis_transport_reuses_one_sync_client_per_channel() -> None:
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport)
        channel: Any = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        assert channel.client is not first  # the asynchronous client is kombu's own
    assert app.conf.broker_url == settings.CELERY_BROKER_URL


@pytest.mark.parametrize("fast", [True, False])
def test_the_broker_transport_is_named_by_its_dotted_path(fast: bool) -> None:
    """settings.py picks the transport per LOOMCYCLE_FAST_TRANSPORT without
    touching kombu's aliases; both reach the test Redis (a Unix socket URL)."""
    from kombu.transport import TRANSPORT_ALIASES
    from kombu.transport import redis as kombu_redis

    from loomcycle_project.settings import celery_broker
    from workers.transport import SocketTransport

    assert celery_broker("redis://h:1/2", True) == ("redis://h:1/2", "workers.transport:Transport")
    assert celery_broker("rediss://h:1/2", True) == ("rediss://h:1/2", None)  # TLS keeps kombu's transport
    assert celery_broker("redis://h:1/2", False) == ("redis://h:1/2", None)
    url, transport = celery_broker(settings.REDIS_URL, fast)
    with Connection(url, transport=transport) as conn:
        assert conn.default_channel.client.ping()
        assert isinstance(conn.transport, Transport) == fast
        assert isinstance(conn.transport, kombu_redis.Transport)
        if fast and settings.REDIS_URL.startswith("redis+socket://"):
            assert isinstance(conn.transport, SocketTransport)
    assert TRANSPORT_ALIASES["redis"] == "kombu.transport.redis:Transport"
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport) == fast_transport()


def test_with_the_fast_transport_off_doorbells_go_through_send_task(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, fast_transport=False)
    doorbell.direct.cache_clear()
    try:
        assert not doorbell.direct()
    finally:
        doorbell.direct.cache_clear()


def test_redis_replies_are_parsed_by_hiredis() -> None:
    from redis._parsers import _HiredisParser

    def parser_of(pool: Any) -> Any:
        conn = pool.get_connection()
        try:
            return conn._parser
        finally:
            pool.release(conn)

    with app.connection_for_write() as conn:
        assert isinstance(parser_of(conn.default_channel._create_client().connection_pool), _HiredisParser)
    assert isinstance(parser_of(sync_client().connection_pool), _HiredisParser)


def _wire(raw: bytes) -> dict[str, Any]:
    """A broker message with its per-message ids and process identity blanked."""
    msg: dict[str, Any] = json.loads(raw)
    task_id = msg["headers"]["id"]
    assert msg["headers"]["root_id"] == msg["properties"]["correlation_id"] == task_id
    for part, key in [("headers", "id"), ("headers", "root_id"), ("properties", "correlation_id")]:
        msg[part][key] = "<id>"
    uuid.UUID(msg["properties"].pop("delivery_tag"))
    return msg


@needs_fast_transport
def test_a_doorbell_is_the_message_send_task_writes() -> None:
    """workers/doorbell.py writes Celery's protocol-v2 message in kombu's Redis
    envelope itself; this pins it to what the pinned Celery and kombu write."""
    queue, client = "lc-test-doorbell", sync_client()
    client.delete(queue)
    app.send_task(
        ITERATE_TASK,
        args=("r_0123456789abcdef", 7),
        queue=queue,
        argsrepr="('r_0123456789abcdef', 7)",
        kwargsrepr="{}",
        declare=[],
    )
    pipe = doorbell.DoorbellPipe()
    pipe.publish("lc-test-doorbell-wake", "3")
    pipe.doorbell(ITERATE_TASK, ("r_0123456789abcdef", 7), queue)
    pipe.send()
    ours, celerys = client.lrange(queue, 0, -1)  # LPUSH: the newest first
    client.delete(queue)
    assert _wire(ours) == _wire(celerys)
    body = json.loads(base64.b64decode(json.loads(ours)["body"]))
    assert body[:2] == [["r_0123456789abcdef", 7], {}]


@needs_fast_transport
def test_a_doorbell_with_an_armed_token_is_the_message_send_task_writes_with_the_kwarg() -> None:
    """A doorbell for a step whose lease its commit armed carries the token as the kwarg
    `token` (apps.runs.engine.adopt), exactly as send_task writes it."""
    queue, client = "lc-test-doorbell-token", sync_client()
    client.delete(queue)
    app.send_task(
        ITERATE_TASK,
        args=("r_0123456789abcdef", 7),
        kwargs={"token": 12},
        queue=queue,
        argsrepr="('r_0123456789abcdef', 7)",
        kwargsrepr="{'token': 12}",
        declare=[],
    )
    pipe = doorbell.DoorbellPipe()
    pipe.doorbell(ITERATE_TASK, ("r_0123456789abcdef", 7), queue, {"token": 12})
    pipe.send()
    ours, celerys = client.lrange(queue, 0, -1)
    client.delete(queue)
    assert _wire(ours) == _wire(celerys)
    body = json.loads(base64.b64decode(json.loads(ours)["body"]))
    assert body[:2] == [["r_0123456789abcdef", 7], {"token": 12}]


@needs_fast_transport
def test_run_doorbells_go_to_the_runs_list_in_one_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.runs import dispatch

    assert dispatch.RUNS == "runs"
    queue = "lc-test-runs"  # the real list may have consumers from other tests; this one has none
    monkeypatch.setattr(dispatch, "RUNS", queue)
    sent: list[list[tuple[Any, ...]]] = []
    real = doorbell.DoorbellPipe.send

    def spy(self: doorbell.DoorbellPipe) -> None:
        sent.append([cmd[0] for cmd in self._pipe.command_stack])
        real(self)

    monkeypatch.setattr(doorbell.DoorbellPipe, "send", spy)
    published = sync_client().pubsub()
    published.subscribe(run_channel("r_0123456789abcdef"))
    try:
        wake_and_enqueue("r_0123456789abcdef", 12, None)  # a wake-up alone rings no doorbell
        assert [args[0] for args in sent[0]] == ["PUBLISH"]
        wake_and_enqueue("r_0123456789abcdef", 13, 4)
        publish, lpush = sent[1]
        assert publish[:3] == ("PUBLISH", run_channel("r_0123456789abcdef"), "13")
        assert lpush[:2] == ("LPUSH", queue)
        [raw] = sync_client().lrange(queue, 0, -1)
        msg = json.loads(raw)
        assert msg["headers"]["task"] == ITERATE_TASK and msg["properties"]["delivery_info"]["routing_key"] == queue
        assert json.loads(base64.b64decode(msg["body"]))[0] == ["r_0123456789abcdef", 4]
        seen = [m["data"] for m in _drain(published)]
        assert seen == [b"12", b"13"]
    finally:
        published.close()
        sync_client().delete(queue)


def test_without_a_direct_broker_the_doorbell_goes_through_send_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker that is not REDIS_URL (or has a key prefix) gets Celery's own publish."""
    monkeypatch.setattr(doorbell, "direct", lambda: False)
    seen: list[tuple[str, Any]] = []

    def capture(sender: str, body: Any, **_: Any) -> None:
        seen.append((sender, body[0]))

    before_task_publish.connect(capture)
    published = sync_client().pubsub()
    published.subscribe(run_channel("r_00000000000000ff"))
    try:
        wake_and_enqueue("r_00000000000000ff", 5, 6)  # no such run: a worker that takes it finds nothing to claim
        assert seen == [(ITERATE_TASK, ("r_00000000000000ff", 6))]
        assert [m["data"] for m in _drain(published, 1)] == [b"5"]
    finally:
        before_task_publish.disconnect(capture)
        published.close()


def _drain(sub: Any, n: int = 2) -> list[dict[str, Any]]:
    out, deadline = [], time.monotonic() + 5
    while time.monotonic() < deadline and len(out) < n:
        msg = sub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        if msg:
            out.append(msg)
    return out


@pytest.mark.usefixtures("agents")
def test_agent_definitions_are_read_once(django_assert_num_queries: Any) -> None:
    row = agent_def_resolve(tenant_id="", name="chan-narrow")
    with django_assert_num_queries(1):
        assert agent_definition(row.id)["channels"]["publish"] == ["handoff/*"]
        assert agent_definition(row.id) is agent_definition(row.id)
    with django_assert_num_queries(2):  # a missing id is not cached: it may be created later
        assert agent_definition("def_0000000000000000") == {}
        assert agent_definition("def_0000000000000000") == {}


@pytest.mark.django_db
def test_only_the_engine_statements_are_prepared() -> None:
    for _ in range(3):
        with store._prepared() as cur:
            cur.execute("SELECT %s::int + 1", [1], prepare=True)
    for _ in range(8):
        with connection.cursor() as cur:
            cur.execute("SELECT %s::int + 2", [1])
    with connection.cursor() as cur:
        cur.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [r[0] for r in cur.fetchall()]
        cur.execute("SHOW plan_cache_mode")
        assert cur.fetchone()[0] == "force_generic_plan"
    # This pooled session may already hold the engine's own statements (an earlier test in this process
    # claimed or committed a run on it); nothing else may be prepared, Django's statements least of all.
    assert "SELECT $1::int + 1" in prepared
    assert [p for p in prepared if p != "SELECT $1::int + 1" and "runs_" not in p] == []


@pytest.mark.django_db(transaction=True)
def test_outside_a_transaction_the_engine_borrows_from_the_pool_first_use_included() -> None:
    """The hot statements borrow a pooled connection for one statement when
    Django's is closed, opening the pool if nothing has yet (a fresh worker's
    first claim); inside atomic() they stay on Django's connection."""
    connection.close()
    connection.close_pool()  # as in a fresh process: the next pool is not open yet
    with store._prepared() as cur:
        cur.execute("SELECT pg_backend_pid()", prepare=True)
        borrowed = cur.fetchone()[0]
    assert connection.connection is None  # Django's own connection was never opened
    assert store.claim(run_id="r_0000000000000000", step=0, owner="test", lease_seconds=5) is None
    assert connection.pool.get_stats()["pool_size"] >= 1
    with transaction.atomic():
        with store._prepared() as cur:
            cur.execute("SELECT pg_backend_pid()", prepare=True)
            inside = cur.fetchone()[0]
        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            assert cur.fetchone()[0] == inside
    assert borrowed > 0


def test_engine_timing_samples_are_buffered_then_pushed(settings: Any) -> None:
    from apps.runs import dispatch

    key = "lc:test:timings"
    client = sync_client()
    client.delete(key)
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, engine_timings_key=key)
    for i in range(5):
        dispatch.record_timing(0.010 + i / 1000, 0.002, 0.0005)
    deadline = time.monotonic() + 5
    while client.llen(key) < 5 and time.monotonic() < deadline:
        time.sleep(dispatch.TIMINGS_FLUSH_S / 2)
    assert [s.decode() for s in client.lrange(key, 0, -1)] == [f"{10 + i:.3f},2.000,0.500" for i in range(5)]
    client.delete(key)
