"""Channel waits park the run (real workers, beat, Postgres, Redis): a
subscribe or await that finds nothing leaves the run `waiting_channel` with no
lease held; a publish, a deferred message becoming visible or the deadline
answers the call exactly once and the run carries on."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.db import connection, transaction

from apps.channels import cursors, selectors, services, waits
from apps.channels.models import ChannelMessage, ChannelWait
from apps.channels.streams import Published, Stream
from apps.runs.models import RunEvent, RunStatus, TranscriptEntry
from apps.substrate.models import ChannelDef
from tests.conftest import run_row, wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents")

HANDOFF = Stream("", "handoff", "global", "")


def _agent(http: httpx.Client, name: str, tool_input: dict[str, Any]) -> None:
    model = "mock-tool-loop?tool=Channel&calls=1&latency_ms=0&input=" + quote(json.dumps(tool_input))
    channels = {"subscribe": ["handoff", "handoff/*"], "publish": []}
    overlay = {"provider": "mock", "model": model, "tools": ["Channel"], "channels": channels}
    resp = http.post("/v1/_agentdef", json={"op": "create", "name": name, "overlay": overlay})
    assert resp.status_code == 200, resp.text


def _start(http: httpx.Client, agent: str) -> str:
    run = http.post("/v1/runs", json={"agent": agent, "prompt": "go", "background": True}).json()
    return str(run["run_id"])


def _parked(http: httpx.Client, agent: str, tool_input: dict[str, Any]) -> str:
    _agent(http, agent, tool_input)
    run_id = _start(http, agent)
    run = wait_status(run_id, RunStatus.WAITING_CHANNEL)
    assert run.lease_owner == "" and run.lease_until is None and run.pending_calls == 1  # no worker holds it
    assert ChannelWait.objects.filter(run_id=run_id).count() == 1
    return run_id


def _publish(stream: Stream, value: Any, **extra: Any) -> Published:
    declared = ChannelDef.objects.get(name=stream.channel, tenant_id="")
    return services.publish(stream=stream, declared=declared, value=value, published_by="_test", **extra)


def _a_backend_waits_on_a_lock() -> bool:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query LIKE '%%channelwait%%'"
        )
        return bool(cur.fetchone()[0])


def _results(run_id: str) -> list[dict[str, Any]]:
    return [e.payload for e in RunEvent.objects.filter(run_id=run_id, type="tool_result").order_by("seq")]


def test_a_publish_wakes_a_parked_subscriber_exactly_once(http: httpx.Client, stack: Any) -> None:
    run_id = _parked(http, "waiter", {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000})
    sent = _publish(HANDOFF, {"hello": "world"})
    wait_status(run_id, RunStatus.COMPLETED)
    (result,) = _results(run_id)
    assert result["is_error"] is False and result["tool_use"]["name"] == "Channel"
    out = json.loads(result["text"])
    assert [m["id"] for m in out["messages"]] == [sent.message_id]
    assert out["messages"][0]["value"] == {"hello": "world"} and out["next_cursor"].startswith("cur_")
    kinds = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("type", flat=True))
    tail = ["tool_call", "usage", "channel_delivery", "tool_result", "text", "usage", "done"]
    assert kinds[kinds.index("tool_call") :] == tail
    roles = [(t.role, t.content[0]["type"]) for t in TranscriptEntry.objects.filter(run_id=run_id).order_by("idx")]
    assert roles == [("user", "text"), ("assistant", "tool_use"), ("user", "tool_result"), ("assistant", "text")]
    assert not ChannelWait.objects.exists()
    assert cursors.subscribe(stream=HANDOFF, from_cursor=None, max_messages=10).messages == []  # cursor committed
    seqs = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))


def test_the_deadline_answers_with_an_empty_result(http: httpx.Client, stack: Any) -> None:
    started = time.monotonic()
    run_id = _parked(http, "impatient", {"op": "subscribe", "channel": "handoff", "wait_ms": 1500})
    wait_status(run_id, RunStatus.COMPLETED, timeout=30)
    assert time.monotonic() - started >= 1.5
    (result,) = _results(run_id)
    assert json.loads(result["text"]) == {"channel": "handoff", "messages": [], "next_cursor": ""}
    assert result["is_error"] is False


def test_await_all_waits_for_every_channel(http: httpx.Client, stack: Any) -> None:
    tool_input = {"op": "await", "channels": ["handoff/a", "handoff/b"], "mode": "all", "wait_ms": 60_000}
    run_id = _parked(http, "fan-in", tool_input)
    _publish(Stream("", "handoff/a", "global", ""), "a")  # checked the wait before it returned
    waits._recheck(run_id, ChannelWait.objects.get(run_id=run_id).call_id)  # and so does a beat tick
    assert run_row(run_id).status == RunStatus.WAITING_CHANNEL  # one channel of two is not enough
    _publish(Stream("", "handoff/b", "global", ""), "b")
    wait_status(run_id, RunStatus.COMPLETED)
    (result,) = _results(run_id)
    out = json.loads(result["text"])
    assert out["satisfied"] is True and out["timed_out"] is False and sorted(out["fired"]) == ["handoff/a", "handoff/b"]
    assert out["total_messages"] == 2


def test_await_times_out_without_error(http: httpx.Client, stack: Any) -> None:
    tool_input = {"op": "await", "channels": ["handoff/a", "handoff/b"], "mode": "at_least", "n": 2, "wait_ms": 1200}
    run_id = _parked(http, "fan-in-timeout", tool_input)
    _publish(Stream("", "handoff/a", "global", ""), "only one")
    wait_status(run_id, RunStatus.COMPLETED, timeout=30)
    out = json.loads(_results(run_id)[0]["text"])
    assert out["satisfied"] is False and out["timed_out"] is True and out["total_messages"] == 1


def test_a_message_that_beat_the_park_is_found_by_the_recheck(http: httpx.Client, stack: Any) -> None:
    """A publisher that committed before the wait row did could not see it; the
    parking iteration's post-commit check answers it (simulated: a message
    inserted without any wake-up)."""
    run_id = _parked(http, "racer", {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000})
    now = datetime.now(UTC)
    ChannelMessage.objects.create(
        id="msg_" + "0" * 15 + "1" + "abcdef01", payload="early", published_at=now, visible_at=now, **HANDOFF.filter()
    )
    assert run_row(run_id).status == RunStatus.WAITING_CHANNEL  # nothing rang (the deadline is a minute away)
    call_id = ChannelWait.objects.get(run_id=run_id).call_id
    waits._recheck(run_id, call_id)
    wait_status(run_id, RunStatus.COMPLETED)
    assert json.loads(_results(run_id)[0]["text"])["messages"][0]["value"] == "early"


def test_a_deferred_message_wakes_the_waiter_when_it_becomes_visible(http: httpx.Client, stack: Any) -> None:
    run_id = _parked(http, "patient", {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000})
    due = datetime.now(UTC) + timedelta(seconds=3)
    _publish(HANDOFF, "deferred", deliver_at=due)
    # The publish checked the wait before it returned: nothing visible yet, so the wait's
    # alarm moved from its deadline to the message's visibility (unless beat already answered it).
    wake_at = ChannelWait.objects.filter(run_id=run_id).values_list("wake_at", flat=True).first()
    assert (wake_at is None and datetime.now(UTC) >= due) or wake_at == due
    wait_status(run_id, RunStatus.COMPLETED, timeout=30)
    assert datetime.now(UTC) >= due
    assert json.loads(_results(run_id)[0]["text"])["messages"][0]["value"] == "deferred"


def test_a_cancelled_waiter_is_never_answered(http: httpx.Client, stack: Any) -> None:
    run_id = _parked(http, "quitter", {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000})
    agent_id = run_row(run_id).agent_id
    assert http.post(f"/v1/agents/{agent_id}/cancel").status_code == 200
    wait_status(run_id, RunStatus.CANCELLED)
    _publish(HANDOFF, "too late")
    assert _results(run_id) == []
    assert not ChannelWait.objects.exists()  # dropped by the publish's wake-up
    # The message is still there for the next reader: the dropped wait consumed nothing.
    assert [m["value"] for m in selectors.peek(stream=HANDOFF, from_cursor=None, max_messages=5).messages] == [
        "too late"
    ]
    assert cursors.subscribe(stream=HANDOFF, from_cursor=None, max_messages=5).messages[0]["value"] == "too late"


def test_subscribers_of_one_stream_share_its_messages(http: httpx.Client, stack: Any) -> None:
    """Two runs parked on the same global stream (one cursor): one message
    answers exactly one of them; the next message answers the other."""
    _agent(http, "twin", {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000})
    first, second = _start(http, "twin"), _start(http, "twin")
    for run_id in (first, second):
        wait_status(run_id, RunStatus.WAITING_CHANNEL)
    _publish(HANDOFF, 1)  # answers exactly one wait before it returns
    (still,) = ChannelWait.objects.filter(run_id__in=(first, second)).values_list("run_id", flat=True)
    wait_status(first if still == second else second, RunStatus.COMPLETED)
    assert run_row(still).status == RunStatus.WAITING_CHANNEL
    _publish(HANDOFF, 2)
    for run_id in (first, second):
        wait_status(run_id, RunStatus.COMPLETED)
    got = sorted(json.loads(_results(r)[0]["text"])["messages"][0]["value"] for r in (first, second))
    assert got == [1, 2]


def test_a_publish_waits_for_a_checker_instead_of_skipping_the_wait(http: httpx.Client, stack: Any) -> None:
    """A checker holding the wait's lock may have read before the message
    committed: the publisher must wait for the lock and check again, or the
    run would sleep until its deadline (a lost wake-up)."""
    run_id = _parked(http, "contended", {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000})
    wait_id = ChannelWait.objects.get(run_id=run_id).id
    locked, release = threading.Event(), threading.Event()

    def checker() -> None:
        try:
            with transaction.atomic():
                ChannelWait.objects.select_for_update().get(id=wait_id)
                locked.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=checker)
    holder.start()
    assert locked.wait(5)
    publisher = threading.Thread(target=lambda: (_publish(HANDOFF, "contended"), connection.close()))
    publisher.start()
    wait_for(_a_backend_waits_on_a_lock, timeout=30)  # the publish's wake-up is blocked on the checker's lock
    assert run_row(run_id).status == RunStatus.WAITING_CHANNEL
    release.set()
    holder.join()
    publisher.join()
    wait_status(run_id, RunStatus.COMPLETED, timeout=30)  # answered by the publisher, not at the 60 s deadline
    assert json.loads(_results(run_id)[0]["text"])["messages"][0]["value"] == "contended"


def test_a_publish_while_redis_is_down_still_wakes_the_parked_subscriber(
    http: httpx.Client, stack: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Redis only rings live readers; the parked wait is a row. A publish whose ring fails (Redis
    restarting: a real client of a socket nobody listens on) answers the wait and succeeds."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    run_id = _parked(http, "down-waiter", {"op": "subscribe", "channel": "handoff", "wait_ms": 60_000})
    dead = redis.Redis(unix_socket_path=str(tmp_path / "no-redis.sock"), retry=Retry(NoBackoff(), 0))
    monkeypatch.setattr(services, "sync_client", lambda: dead)
    sent = _publish(HANDOFF, "while redis is down")
    wait_status(run_id, RunStatus.COMPLETED)
    (result,) = _results(run_id)
    assert [m["id"] for m in json.loads(result["text"])["messages"]] == [sent.message_id]
