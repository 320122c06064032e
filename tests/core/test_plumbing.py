"""Process-level plumbing the hot paths rely on: the Celery app's Redis
transport reuses one client per channel and parses replies with hiredis; the
doorbell is published without a per-message queue declaration; agent
definitions are read once per process; the engine's statements are prepared,
other queries are not."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery.signals import before_task_publish
from django.conf import settings
from django.db import connection
from kombu import Connection

from apps.core.redis import sync_client
from apps.runs import store
from apps.runs.dispatch import ITERATE_TASK, enqueue_iteration
from apps.substrate.selectors import agent_def_resolve, agent_definition
from workers.celery import app
from workers.transport import Transport


def test_the_redis_transport_reuses_one_sync_client_per_channel() -> None:
    with Connection(settings.CELERY_BROKER_URL) as conn:
        assert isinstance(conn.transport, Transport)
        channel: Any = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        assert channel.client is not first  # the asynchronous client is kombu's own
    assert app.conf.broker_url == settings.CELERY_BROKER_URL


def test_redis_replies_are_parsed_by_hiredis() -> None:
    from redis._parsers import _HiredisParser

    def parser_of(pool: Any) -> Any:
        conn = pool.get_connection()
        try:
            return conn._parser
        finally:
            pool.release(conn)

    with Connection(settings.CELERY_BROKER_URL) as conn:
        assert isinstance(parser_of(conn.default_channel._create_client().connection_pool), _HiredisParser)
    assert isinstance(parser_of(sync_client().connection_pool), _HiredisParser)


def test_the_doorbell_skips_the_queue_declaration_and_the_argument_repr() -> None:
    """Workers run the doorbell end to end in tests/runs; this pins what makes it cheap."""
    seen: list[dict[str, Any]] = []

    def capture(sender: str, body: Any, declare: Any, headers: dict[str, Any], **kw: Any) -> None:
        seen.append({"task": sender, "body": body, "declare": declare, "headers": headers, "rk": kw["routing_key"]})

    before_task_publish.connect(capture)
    try:
        enqueue_iteration("r_0123456789abcdef", 7)
    finally:
        before_task_publish.disconnect(capture)
    [msg] = seen
    assert msg["task"] == ITERATE_TASK and msg["rk"] == "runs"
    assert msg["declare"] == []
    assert msg["headers"]["argsrepr"] == "('r_0123456789abcdef', 7)"
    assert msg["body"][0] == ("r_0123456789abcdef", 7)


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
    assert prepared == ["SELECT $1::int + 1"]


def test_engine_timing_samples_are_buffered_then_pushed(monkeypatch: pytest.MonkeyPatch) -> None:
    from apps.runs import dispatch
    from loomcycle_project import env as E

    key = "lc:test:timings"
    client = sync_client()
    client.delete(key)
    monkeypatch.setattr(E, "ENGINE_TIMINGS_KEY", key)
    for i in range(5):
        dispatch.record_timing(0.010 + i / 1000, 0.002)
    deadline = time.monotonic() + 5
    while client.llen(key) < 5 and time.monotonic() < deadline:
        time.sleep(dispatch.TIMINGS_FLUSH_S / 2)
    assert [s.decode() for s in client.lrange(key, 0, -1)] == [f"{10 + i:.3f},2.000" for i in range(5)]
    client.delete(key)
