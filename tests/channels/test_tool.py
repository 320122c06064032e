"""The `Channel` tool's semantics, called as the engine calls it (a
ToolContext of a yaml agent), against real Postgres and Redis: hand-off,
ordering, cursors, peek, ack regression, ACLs, scopes, deferred delivery,
trimming, TTL, await without waiting, broadcast."""

from __future__ import annotations

import itertools
import json
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from apps.channels import selectors, services
from apps.channels.models import ChannelCursor, ChannelMessage
from apps.channels.streams import Stream
from apps.channels.tools import channel_allowed, channel_execute
from apps.core.tools import ToolContext, ToolResult
from apps.substrate.models import AgentDef
from apps.substrate.selectors import agent_def_resolve

pytestmark = pytest.mark.usefixtures("agents")


def ctx(agent: str = "chan-all", user_id: str = "u1", tenant_id: str = "") -> ToolContext:
    row = agent_def_resolve(tenant_id=tenant_id, name=agent)
    return ToolContext(
        run_id="r_0000000000000001",
        agent_id="a_0000000000000001",
        session_id="s_0000000000000001",
        tenant_id=tenant_id,
        user_id=user_id,
        agent_name=agent,
        agent_def_id=row.id,
        agent_def_sha256=row.content_sha256,
        provider="mock",
        model="mock-generic",
        step=0,
        call_id="c1",
        tools=("Channel",),
        cancelled=threading.Event(),
    )


def call(data: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
    """One tool call: a fresh call_id each time, as the engine gives every call."""
    return channel_execute(replace(context or ctx(), call_id=f"call_{next(_CALLS)}"), data)


_CALLS = itertools.count()


def ok(data: dict[str, Any], context: ToolContext | None = None) -> Any:
    result = call(data, context)
    assert result.is_error is False, result.text
    assert result.park is None
    return json.loads(result.text)


def refused(data: dict[str, Any], needle: str, context: ToolContext | None = None) -> None:
    result = call(data, context)
    assert result.is_error is True, result.text
    assert needle in result.text, result.text


def values(out: dict[str, Any]) -> list[Any]:
    return [m["value"] for m in out["messages"]]


def test_handoff_in_order_and_the_cursor_is_committed() -> None:
    first = ok({"op": "publish", "channel": "handoff", "value": {"n": 1}})
    assert first["message_id"].startswith("msg_") and len(first["message_id"]) == 28
    assert first["dropped_oldest"] == 0 and "visible_at" not in first
    ok({"op": "publish", "channel": "handoff", "value": {"n": 2}})
    ok({"op": "publish", "channel": "handoff", "value": {"n": 3}})
    got = ok({"op": "subscribe", "channel": "handoff", "max_messages": 2})
    assert values(got) == [{"n": 1}, {"n": 2}]
    assert got["next_cursor"].startswith("cur_") and got["channel"] == "handoff"
    assert ok({"op": "subscribe", "channel": "handoff"})["messages"][0]["value"] == {"n": 3}
    empty = ok({"op": "subscribe", "channel": "handoff"})
    assert empty == {"channel": "handoff", "messages": [], "next_cursor": ""}
    # A global channel has ONE cursor: another agent's subscribe sees nothing new either.
    assert ok({"op": "subscribe", "channel": "handoff"}, ctx("chan-narrow"))["messages"] == []


def test_results_are_compact_json_with_sorted_keys() -> None:
    result = call({"op": "publish", "channel": "handoff", "value": {"b": 1, "a": 2}})
    assert result.text.startswith('{"channel":"handoff","dropped_oldest":0,"message_id":"msg_')
    (event,) = result.events
    assert event["type"] == "channel_publish"
    assert event["channel"]["payload_preview"] == '{"b":1,"a":2}' and event["channel"]["payload_bytes"] == 13


def test_subscribe_emits_one_delivery_event_per_message() -> None:
    for n in range(3):
        ok({"op": "publish", "channel": "handoff", "value": n})
    result = call({"op": "subscribe", "channel": "handoff"})
    out = json.loads(result.text)
    assert [e["type"] for e in result.events] == ["channel_delivery"] * 3
    assert [e["channel"]["message_id"] for e in result.events] == [m["id"] for m in out["messages"]]
    assert result.events[-1]["channel"]["cursor"] == out["next_cursor"]


def test_peek_does_not_commit_and_from_cursor_replays() -> None:
    for n in range(3):
        ok({"op": "publish", "channel": "handoff", "value": n})
    peeked = ok({"op": "peek", "channel": "handoff"})
    assert values(peeked) == [0, 1, 2] and "next_cursor" not in peeked
    got = ok({"op": "subscribe", "channel": "handoff", "max_messages": 1})
    assert values(got) == [0]
    after_first = ok({"op": "peek", "channel": "handoff", "from_cursor": got["next_cursor"]})
    assert values(after_first) == [1, 2]
    assert values(ok({"op": "subscribe", "channel": "handoff", "from_cursor": "cur_0"})) == [0, 1, 2]


def test_ack_moves_forward_and_refuses_a_regression() -> None:
    for n in range(3):
        ok({"op": "publish", "channel": "handoff", "value": n})
    peeked = selectors.peek(stream=Stream("", "handoff", "global", ""), from_cursor=None, max_messages=10)
    assert ok({"op": "ack", "channel": "handoff", "cursor": peeked.cursors[1]}) == {"ok": True}
    assert values(ok({"op": "subscribe", "channel": "handoff"})) == [2]
    older = {"op": "ack", "channel": "handoff", "cursor": peeked.cursors[0]}
    refused(older, "ack: cursor_regression: ack cursor older than")
    assert ok({"op": "ack", "channel": "handoff", "cursor": peeked.cursors[2]}) == {"ok": True}  # same: no-op
    refused({"op": "ack", "channel": "handoff", "cursor": "msg_00"}, "invalid channel cursor")
    refused({"op": "ack", "channel": "handoff"}, "missing required field: cursor")


@pytest.mark.parametrize(
    ("agent", "data", "needle"),
    [
        ("chan-all", {"op": "publish", "channel": "nope", "value": 1}, 'channel "nope" is not declared'),
        ("chan-none", {"op": "publish", "channel": "handoff", "value": 1}, "this agent has no publish allowlist"),
        ("chan-narrow", {"op": "publish", "channel": "handoff", "value": 1}, "publish not allowed on channel"),
        ("chan-narrow", {"op": "subscribe", "channel": "handoff/a"}, "subscribe not allowed on channel"),
        ("chan-all", {"op": "publish", "channel": "sys-feed", "value": 1}, "`publisher: system`"),
        ("chan-all", {"op": "publish", "channel": "_system/alarms", "value": 1}, "reserved prefix"),
        ("chan-all", {"op": "publish", "channel": "handoff"}, "publish: missing required field: value"),
        ("chan-all", {"op": "release", "channel": "handoff"}, "unknown op 'release'"),
        ("chan-all", {"op": "peek", "channel": "handoff", "limit": 3}, "unknown fields ['limit']"),
        ("chan-all", {"op": "subscribe", "channel": "handoff", "from_cursor": "cur_zz"}, "invalid channel cursor"),
        ("chan-all", {"op": "publish", "channel": "handoff", "value": 1, "deliver_at": "soon"}, "invalid deliver_at"),
        ("chan-all", {"op": "await", "channels": []}, "await: missing required field: channels"),
        ("chan-all", {"op": "await", "channels": ["handoff"], "mode": "most"}, 'await: unknown mode "most"'),
        ("chan-all", {"op": "await", "channels": ["handoff"], "mode": "at_least"}, "mode=at_least requires n > 0"),
        ("chan-all", {"op": "await", "channels": [f"c{i}" for i in range(33)]}, "too many channels (33 > max 32)"),
    ],
)
def test_refusals_are_is_error_texts(agent: str, data: dict[str, Any], needle: str) -> None:
    refused(data, needle, ctx(agent))
    assert not ChannelMessage.objects.exists()


def test_the_allowlist_matcher() -> None:
    assert channel_allowed(["handoff/*"], "handoff/a")
    assert not channel_allowed(["handoff/*"], "handoff")  # children only, not the bare prefix
    assert not channel_allowed(["handoff/*"], "handoff/")
    assert not channel_allowed(["*"], "handoff")  # a bare * is a literal name
    assert not channel_allowed(["handoff/*"], "handoff/../x")
    assert not channel_allowed(["handoff/*"], "handoff//x")
    assert channel_allowed(["handoff"], " handoff ")


def test_oversized_payload_is_refused() -> None:
    refused({"op": "publish", "channel": "handoff", "value": "x" * 70_000}, "payload (70002 bytes) exceeds max 65536")


def test_a_service_error_reads_code_then_message_as_every_tools_does() -> None:
    """One format for a service's error across the op tools (apps.core.tools.op_tool_result):
    `<code>: <message>`, as Memory's and Evaluation's (docs/memory.md, docs/evaluation.md)."""
    result = call({"op": "publish", "channel": "handoff", "value": "x" * 70_000})
    assert (result.is_error, result.text) == (
        True,
        "channel_value_too_large: payload (70002 bytes) exceeds max 65536 bytes",
    )


def test_user_and_agent_scopes_partition_the_stream() -> None:
    ok({"op": "publish", "channel": "per-user", "value": "for u1"}, ctx(user_id="u1"))
    assert ok({"op": "subscribe", "channel": "per-user"}, ctx(user_id="u2"))["messages"] == []
    assert values(ok({"op": "subscribe", "channel": "per-user"}, ctx(user_id="u1"))) == ["for u1"]
    refused({"op": "subscribe", "channel": "per-user"}, "has scope=user but the run has no user_id", ctx(user_id=""))
    ok({"op": "publish", "channel": "per-agent", "value": "mine"})
    row = ChannelMessage.objects.get(channel="per-agent")
    assert (row.scope, row.scope_id) == ("agent", "chan-all")


def test_tenants_do_not_share_streams(people: dict[str, dict[str, str]]) -> None:
    ok({"op": "publish", "channel": "handoff", "value": "tenant a"}, ctx(tenant_id="acme"))
    assert ok({"op": "peek", "channel": "handoff"}, ctx(tenant_id="globex"))["messages"] == []
    assert values(ok({"op": "peek", "channel": "handoff"}, ctx(tenant_id="acme"))) == ["tenant a"]


def test_deferred_delivery_becomes_visible_at_deliver_at() -> None:
    at = datetime.now(UTC) + timedelta(seconds=1.5)
    out = ok({"op": "publish", "channel": "handoff", "value": "later", "deliver_at": at.isoformat()})
    assert out["visible_at"].startswith(at.strftime("%Y-%m-%dT%H:%M:%S"))
    ok({"op": "publish", "channel": "handoff", "value": "now"})
    assert values(ok({"op": "subscribe", "channel": "handoff"})) == ["now"]
    time.sleep(max(0.0, (at - datetime.now(UTC)).total_seconds()) + 0.1)
    # Ordered by visibility: the deferred message is read after the cursor of "now", not skipped.
    assert values(ok({"op": "subscribe", "channel": "handoff"})) == ["later"]
    past = ok({"op": "publish", "channel": "handoff", "value": 1, "deliver_at": "2020-01-01T00:00:00Z"})
    assert "visible_at" not in past  # a past deliver_at is immediate


def test_overflow_trims_the_oldest() -> None:
    drops = [ok({"op": "publish", "channel": "capped", "value": n})["dropped_oldest"] for n in range(4)]
    assert drops == [0, 0, 1, 1]
    assert values(ok({"op": "peek", "channel": "capped"})) == [2, 3]


def test_expired_messages_are_invisible_then_swept() -> None:
    ok({"op": "publish", "channel": "short-lived", "value": "brief"})
    ok({"op": "publish", "channel": "handoff", "value": "kept", "ttl": 3600})
    time.sleep(1.1)
    assert ok({"op": "peek", "channel": "short-lived"})["messages"] == []
    assert services.channels_expired_sweep() == 1
    assert list(ChannelMessage.objects.values_list("channel", flat=True)) == ["handoff"]


def test_await_without_waiting_reports_modes() -> None:
    ok({"op": "publish", "channel": "handoff/a", "value": "a1"})
    anyone = ok({"op": "await", "channels": ["handoff/a", "handoff/b"]})
    assert anyone["satisfied"] is True and anyone["timed_out"] is False and anyone["fired"] == ["handoff/a"]
    everyone = ok({"op": "await", "channels": ["handoff/a", "handoff/b"], "mode": "all"})
    assert everyone["satisfied"] is False and everyone["timed_out"] is True
    ok({"op": "publish", "channel": "handoff/a", "value": "a2"})
    two = ok({"op": "await", "channels": ["handoff/a", "handoff/b", "handoff/a"], "mode": "at_least", "n": 2})
    assert two["satisfied"] is True and two["total_messages"] == 2
    assert list(two["results"]) == ["handoff/a", "handoff/b"]
    assert not ChannelCursor.objects.filter(channel="handoff/a").exclude(cursor="").exists()  # await never commits


def test_broadcast_is_all_or_nothing_on_acl() -> None:
    narrow = ctx("chan-narrow")
    refused({"op": "broadcast", "channels": ["handoff/a", "handoff"], "value": 1}, "publish not allowed", narrow)
    assert not ChannelMessage.objects.exists()
    out = ok({"op": "broadcast", "channels": ["handoff/a", "handoff/b"], "value": {"x": 1}}, ctx("chan-narrow"))
    assert out["published"] == 2 and out["failed"] == 0
    assert [r["channel"] for r in out["results"]] == ["handoff/a", "handoff/b"]


def test_list_channels_shows_the_allowlists() -> None:
    assert ok({"op": "list_channels"}, ctx("chan-narrow")) == {"publish": ["handoff/*"], "subscribe": ["handoff"]}


def test_concurrent_publishers_never_let_a_cursor_skip_a_message() -> None:
    """Publishes of several threads interleave with a reader that commits its
    cursor as it goes: every message is delivered exactly once, in order per publisher."""
    per_thread, threads = 40, 4
    publisher = ctx()

    def publish(tag: int) -> None:
        for n in range(per_thread):
            call({"op": "publish", "channel": "handoff", "value": [tag, n]}, publisher)

    workers = [threading.Thread(target=publish, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    seen: list[list[int]] = []
    deadline = time.monotonic() + 30
    while len(seen) < per_thread * threads and time.monotonic() < deadline:
        seen += values(ok({"op": "subscribe", "channel": "handoff", "max_messages": 7}))
    for w in workers:
        w.join()
    assert sorted(map(tuple, seen)) == sorted((t, n) for t in range(threads) for n in range(per_thread))
    for t in range(threads):
        assert [n for tag, n in seen if tag == t] == list(range(per_thread))


def test_a_redelivered_publish_is_not_published_twice() -> None:
    """The same tool call (run, step, call_id) repeated after a lost iteration
    returns its first message; another call publishes anew."""

    def publish(call_id: str, data: dict[str, Any]) -> dict[str, Any]:
        result = channel_execute(replace(ctx(), call_id=call_id), data)
        assert result.is_error is False, result.text
        out: dict[str, Any] = json.loads(result.text)
        return out

    first = publish("c1", {"op": "publish", "channel": "handoff", "value": "once"})
    assert publish("c1", {"op": "publish", "channel": "handoff", "value": "once"}) == first
    assert publish("c2", {"op": "publish", "channel": "handoff", "value": "once"})["message_id"] != first["message_id"]
    fan = {"op": "broadcast", "channels": ["handoff/a", "handoff/b"], "value": 1}
    assert publish("c3", fan) == publish("c3", fan)
    assert ChannelMessage.objects.count() == 4


def test_a_malformed_channels_field_is_a_clear_refusal() -> None:
    row = agent_def_resolve(tenant_id="", name="chan-none")
    AgentDef.objects.filter(id=row.id).update(definition={**row.definition, "channels": ["handoff"]})
    broken = replace(ctx("chan-none"), agent_def_id=row.id)
    refused({"op": "list_channels"}, "`channels` field must be a mapping", broken)
