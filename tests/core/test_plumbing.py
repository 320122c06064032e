"""Process-level plumbing the hot paths rely on: the Celery app's Redis
transport reuses one client per channel; agent definitions are read once per
process; the engine's statements are prepared, other queries are not."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from kombu import Connection

from apps.runs import store
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
