"""The channels REST plane and the `/ws/channels/` socket against the real
Daphne (real Postgres, Redis pub/sub doorbells): CRUD and its 409s, the
publish/subscribe/ack/peek round trip, long-poll wake-ups and timeouts,
deferred delivery, `_await` / `_broadcast`, system publish, per-user streams
and isolation, and the 4xx answers to bad input."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from apps.channels.models import ChannelMessage
from apps.channels.streams import bell
from apps.core.redis import sync_client
from apps.substrate import tokens
from apps.substrate.models import ChannelDef, DefSource
from tests.conftest import wait_for

pytestmark = pytest.mark.usefixtures("agents")

BOARD = "chanapi/board"  # yaml, scope global, a `/` in its name
INBOX = "chanapi-inbox"  # yaml, scope user
SYSTEM = "_system/alarms/chanapi"  # yaml, publisher system


@pytest.fixture
def alice(web: str, people: dict[str, dict[str, str]]) -> Iterator[httpx.Client]:
    """Tenant acme, substrate:tenant."""
    with httpx.Client(base_url=web, headers=people["alice"], timeout=30) as client:
        yield client


def _client(web: str, headers: dict[str, str]) -> httpx.Client:
    return httpx.Client(base_url=web, headers=headers, timeout=30)


def _isolated(subject: str) -> dict[str, str]:
    """An isolated member of acme (substrate:user) allowed to read and publish channels."""
    token = tokens.token_create(
        name=f"iso-{subject}",
        tenant_id="acme",
        subject=subject,
        scopes=["substrate:user", "channel:read", "channel:publish"],
    )["token"]
    return {"authorization": f"Bearer {token}"}


def _error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body: dict[str, Any] = resp.json()
    assert body["code"] == code, body
    return body


def _publish(client: httpx.Client, name: str, payload: Any, **extra: Any) -> dict[str, Any]:
    resp = client.post(f"/v1/_channels/{name}/publish", json={"payload": payload, **extra})
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def _values(body: dict[str, Any]) -> list[Any]:
    return [m["value"] for m in body["messages"]]


def _peek(client: httpx.Client, name: str, **query: str) -> list[Any]:
    resp = client.get(f"/v1/_channels/{name}/peek", params=query)
    assert resp.status_code == 200, resp.text
    return _values(resp.json())


def _create(client: httpx.Client, name: str, **fields: Any) -> dict[str, Any]:
    resp = client.post("/v1/_channels", json={"name": name, **fields})
    assert resp.status_code == 201, resp.text
    out: dict[str, Any] = resp.json()
    return out


# --- declarations ---------------------------------------------------------------------


def test_runtime_channel_crud_and_conflicts(alice: httpx.Client, web: str, people: dict[str, dict[str, str]]) -> None:
    made = _create(alice, "chanapi-jobs", description="jobs", max_messages=5, default_ttl=60)
    assert made["name"] == "chanapi-jobs" and made["scope"] == "global" and made["semantic"] == "queue"
    assert (made["max_messages"], made["default_ttl"], made["source"]) == (5, 60, "runtime")
    _error(alice.post("/v1/_channels", json={"name": "chanapi-jobs"}), 409, "channel_name_in_use")
    _error(alice.post("/v1/_channels", json={"name": BOARD}), 409, "channel_yaml_immutable")

    listed = {c["name"]: c for c in alice.get("/v1/_channels").json()["channels"]}
    assert listed["chanapi-jobs"]["source"] == "runtime" and listed[BOARD]["source"] == "yaml"
    assert listed[INBOX]["scope"] == "user"

    resp = alice.patch("/v1/_channels/chanapi-jobs", json={"description": "renamed", "max_messages": 0})
    assert resp.status_code == 200, resp.text
    assert resp.json()["description"] == "renamed" and resp.json()["max_messages"] == 0
    _error(alice.patch(f"/v1/_channels/{BOARD}", json={"description": "x"}), 409, "channel_yaml_immutable")
    _error(alice.delete(f"/v1/_channels/{BOARD}"), 409, "channel_yaml_immutable")
    _error(alice.patch("/v1/_channels/chanapi-none", json={"description": "x"}), 404, "channel_not_found")

    _publish(alice, "chanapi-jobs", {"n": 1})
    with _client(web, people["charlie"]) as charlie:  # another tenant: the runtime channel is not there
        assert "chanapi-jobs" not in {c["name"] for c in charlie.get("/v1/_channels").json()["channels"]}
        _error(charlie.post("/v1/_channels/chanapi-jobs/publish", json={"payload": 1}), 404, "channel_not_declared")
        _error(charlie.delete("/v1/_channels/chanapi-jobs"), 404, "channel_not_found")

    assert alice.delete("/v1/_channels/chanapi-jobs").status_code == 204
    assert not ChannelMessage.objects.filter(channel="chanapi-jobs").exists()  # its messages went with it
    _error(alice.post("/v1/_channels/chanapi-jobs/publish", json={"payload": 1}), 404, "channel_not_declared")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"name": "bad name"}, "invalid_channel_name"),
        ({"name": "a//b"}, "invalid_channel_name"),
        ({"name": "_system/mine"}, "channel_name_reserved"),
        ({"name": "_await"}, "channel_name_reserved"),
        ({"name": "ok", "scope": "planet"}, "invalid_body"),
        ({"name": "ok", "max_messages": -1}, "invalid_body"),
        ({"name": "ok", "max_messages": "5"}, "invalid_body"),
        ({"name": "ok", "colour": "blue"}, "invalid_body"),
        ({}, "invalid_body"),
    ],
)
def test_create_refuses_bad_input_with_400(alice: httpx.Client, body: dict[str, Any], code: str) -> None:
    _error(alice.post("/v1/_channels", json=body), 400, code)


def test_names_with_slashes_reach_every_route_even_when_they_end_like_one(alice: httpx.Client) -> None:
    _create(alice, "chanapi/jobs")
    _create(alice, "chanapi/jobs/ack")  # ends like the ack route
    _publish(alice, "chanapi/jobs", "to jobs")
    _publish(alice, "chanapi/jobs/ack", "to jobs/ack")
    assert _peek(alice, "chanapi/jobs") == ["to jobs"] and _peek(alice, "chanapi/jobs/ack") == ["to jobs/ack"]
    resp = alice.patch("/v1/_channels/chanapi/jobs/ack", json={"description": "patched"})
    assert resp.status_code == 200 and resp.json()["name"] == "chanapi/jobs/ack", resp.text
    assert alice.delete("/v1/_channels/chanapi/jobs/ack").status_code == 204
    names = {c["name"] for c in alice.get("/v1/_channels").json()["channels"]}
    assert "chanapi/jobs" in names and "chanapi/jobs/ack" not in names
    assert alice.post("/v1/_channels/chanapi/jobs/purge").json() == {"name": "chanapi/jobs", "purged": 1}
    assert _peek(alice, "chanapi/jobs") == []


# --- one stream -----------------------------------------------------------------------


def test_publish_subscribe_ack_peek_round_trip(alice: httpx.Client) -> None:
    first = _publish(alice, BOARD, {"n": 1})
    assert first["channel"] == BOARD and first["msg_id"].startswith("msg_") and first["dropped_oldest"] == 0
    assert "visible_at" not in first and first["created_at"].endswith("Z")
    _publish(alice, BOARD, [2, "two"])
    assert _peek(alice, BOARD) == [{"n": 1}, [2, "two"]]  # peek reads from the oldest, commits nothing

    one = alice.post(f"/v1/_channels/{BOARD}/subscribe", json={"max_messages": 1}).json()
    assert one["channel"] == BOARD and _values(one) == [{"n": 1}] and one["messages"][0]["id"] == first["msg_id"]
    two = alice.post(f"/v1/_channels/{BOARD}/subscribe").json()  # no body: from the committed cursor
    assert _values(two) == [[2, "two"]]
    empty = alice.post(f"/v1/_channels/{BOARD}/subscribe", json={}).json()
    assert empty == {"channel": BOARD, "messages": [], "next_cursor": ""}

    _error(
        alice.post(f"/v1/_channels/{BOARD}/ack", json={"cursor": one["next_cursor"]}), 409, "channel_cursor_regression"
    )
    assert alice.post(f"/v1/_channels/{BOARD}/ack", json={"cursor": two["next_cursor"]}).json() == {"ok": True}
    replay = alice.post(f"/v1/_channels/{BOARD}/subscribe", json={"from_cursor": "cur_0"}).json()
    assert _values(replay) == [{"n": 1}, [2, "two"]]
    assert _peek(alice, BOARD, from_cursor=one["next_cursor"]) == [[2, "two"]]
    assert _peek(alice, BOARD, max_messages="1") == [{"n": 1}]

    row = ChannelMessage.objects.get(id=first["msg_id"])
    assert (row.tenant_id, row.scope, row.scope_id) == ("acme", "global", "")  # the stream agents of acme use
    assert (row.published_by, row.published_by_user_id) == ("_admin", "_admin")


def test_bad_input_is_a_400_never_a_500(alice: httpx.Client) -> None:
    url = f"/v1/_channels/{BOARD}"
    _error(alice.post(url + "/publish", json={}), 400, "missing_payload")
    _error(alice.post(url + "/publish", json={"payload": None}), 400, "missing_payload")
    _error(alice.post(url + "/publish", json={"payload": 1, "deliver_at": "tomorrow"}), 400, "invalid_deliver_at")
    _error(alice.post(url + "/publish", json={"payload": 1, "ttl": -5}), 400, "invalid_body")
    _error(alice.post(url + "/publish", json={"payload": 1, "extra": True}), 400, "invalid_body")
    bad_json = alice.post(url + "/publish", content=b'{"payload": ', headers={"content-type": "application/json"})
    _error(bad_json, 400, "invalid_json")
    _error(alice.post(url + "/publish", json=[1, 2]), 400, "invalid_body")
    _error(alice.post(url + "/subscribe", json={"from_cursor": "nope"}), 400, "invalid_cursor")
    _error(alice.post(url + "/subscribe", json={"wait_ms": "100"}), 400, "invalid_body")
    _error(alice.post(url + "/subscribe", json={"max_messages": True}), 400, "invalid_body")
    _error(alice.post(url + "/ack", json={"cursor": "cur_zz"}), 400, "invalid_cursor")
    _error(alice.post(url + "/ack", json={}), 400, "missing_cursor")
    _error(alice.get(url + "/peek", params={"from_cursor": "msg_1"}), 400, "invalid_cursor")
    _error(alice.get(url + "/peek", params={"max_messages": "lots"}), 400, "invalid_max_messages")
    _error(alice.post("/v1/_channels/chanapi-undeclared/publish", json={"payload": 1}), 404, "channel_not_declared")

    big = {"blob": "x" * 70_000}  # over LOOMCYCLE_CHANNELS_MAX_VALUE_BYTES (64 KiB), under the body cap
    _error(alice.post(url + "/publish", json={"payload": big}), 413, "channel_value_too_large")
    assert _peek(alice, BOARD) == []  # nothing was written by any of these


def test_deferred_message_is_invisible_until_due_and_wakes_a_long_poll(alice: httpx.Client) -> None:
    due = datetime.now(UTC) + timedelta(seconds=1.5)
    out = _publish(alice, BOARD, "later", deliver_at=due.isoformat().replace("+00:00", "Z"))
    assert "visible_at" in out
    assert _peek(alice, BOARD) == []
    started = time.monotonic()
    got = alice.post(f"/v1/_channels/{BOARD}/subscribe", json={"wait_ms": 8000}).json()
    assert _values(got) == ["later"]  # no publish rang: the once-a-second re-read found it
    assert datetime.now(UTC) >= due - timedelta(milliseconds=50) and time.monotonic() - started < 4


def test_long_poll_subscribe_is_woken_by_a_publish(alice: httpx.Client, web: str, people: dict[str, Any]) -> None:
    answer: dict[str, Any] = {}

    def wait() -> None:
        with _client(web, people["alice"]) as other:
            answer["resp"] = other.post(f"/v1/_channels/{BOARD}/subscribe", json={"wait_ms": 15_000})
            answer["at"] = time.monotonic()

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.8)
    assert "resp" not in answer  # still parked on the doorbell
    published_at = time.monotonic()
    _publish(alice, BOARD, "ring")
    waiter.join(timeout=10)
    assert answer["resp"].status_code == 200 and _values(answer["resp"].json()) == ["ring"]
    assert answer["at"] - published_at < 1.0, answer["at"] - published_at
    assert alice.post(f"/v1/_channels/{BOARD}/subscribe").json()["messages"] == []  # the long-poll committed


def test_long_poll_timeout_is_an_empty_200(alice: httpx.Client) -> None:
    started = time.monotonic()
    resp = alice.post(f"/v1/_channels/{BOARD}/subscribe", json={"wait_ms": 700})
    assert resp.status_code == 200 and resp.json() == {"channel": BOARD, "messages": [], "next_cursor": ""}
    assert 0.65 <= time.monotonic() - started < 5


# --- fan-in / fan-out -------------------------------------------------------------------


def test_await_any_all_and_at_least_never_commit(alice: httpx.Client) -> None:
    _create(alice, "chanapi-b")
    pair = [BOARD, "chanapi-b"]
    timer = threading.Timer(0.5, lambda: _publish(alice, "chanapi-b", "b1"))
    timer.start()
    anyone = alice.post("/v1/_channels/_await", json={"channels": pair, "wait_ms": 10_000}).json()
    timer.join()
    assert anyone["satisfied"] is True and anyone["timed_out"] is False and anyone["fired"] == ["chanapi-b"]
    assert anyone["mode"] == "any" and anyone["total_messages"] == 1
    assert _values(anyone["results"]["chanapi-b"]) == ["b1"] and anyone["results"][BOARD]["messages"] == []

    both = alice.post("/v1/_channels/_await", json={"channels": pair, "mode": "all", "wait_ms": 300}).json()
    assert both["satisfied"] is False and both["timed_out"] is True
    _publish(alice, BOARD, "a1")
    both = alice.post("/v1/_channels/_await", json={"channels": pair, "mode": "all"}).json()
    assert both["satisfied"] is True and sorted(both["fired"]) == sorted(pair)

    body = {"channels": pair, "mode": "at_least", "n": 3}
    assert alice.post("/v1/_channels/_await", json=body).json()["satisfied"] is False
    _publish(alice, "chanapi-b", "b2")
    three = alice.post("/v1/_channels/_await", json=body).json()
    assert three["satisfied"] is True and three["total_messages"] == 3
    # await never commits: a subscribe still gets everything
    assert _values(alice.post("/v1/_channels/chanapi-b/subscribe").json()) == ["b1", "b2"]

    _error(alice.post("/v1/_channels/_await", json={"channels": pair, "mode": "most"}), 400, "invalid_mode")
    _error(alice.post("/v1/_channels/_await", json={"channels": pair, "mode": "at_least"}), 400, "invalid_n")
    _error(alice.post("/v1/_channels/_await", json={"channels": []}), 400, "missing_channels")
    _error(alice.post("/v1/_channels/_await", json={"channels": [BOARD, "nope"]}), 404, "channel_not_declared")
    _error(alice.post("/v1/_channels/_await", json={"channels": [INBOX]}), 400, "channel_scope_invalid")
    user_await = alice.post("/v1/_channels/_await", json={"channels": [INBOX], "scope": "user", "scope_id": "u9"})
    assert user_await.status_code == 200 and user_await.json()["satisfied"] is False


def test_broadcast_is_all_or_nothing(alice: httpx.Client) -> None:
    _create(alice, "chanapi-c")
    _error(
        alice.post("/v1/_channels/_broadcast", json={"channels": [BOARD, "chanapi-undeclared"], "payload": "x"}),
        404,
        "channel_not_declared",
    )
    assert _peek(alice, BOARD) == []  # nothing was published
    _error(alice.post("/v1/_channels/_broadcast", json={"channels": [BOARD]}), 400, "missing_payload")
    big = {"channels": [BOARD], "payload": {"blob": "x" * 70_000}, "deliver_at": "not a time"}
    _error(alice.post("/v1/_channels/_broadcast", json=big), 413, "channel_value_too_large")  # size first
    resp = alice.post("/v1/_channels/_broadcast", json={"channels": [BOARD, "chanapi-c", BOARD], "payload": {"k": 1}})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["published"] == 2 and out["failed"] == 0
    assert [r["channel"] for r in out["results"]] == [BOARD, "chanapi-c"] and all("msg_id" in r for r in out["results"])
    assert _peek(alice, BOARD) == [{"k": 1}] and _peek(alice, "chanapi-c") == [{"k": 1}]
    per_user = alice.post(
        "/v1/_channels/_broadcast", json={"channels": [INBOX], "scope_id": "u5", "payload": "hello u5"}
    ).json()
    assert per_user["published"] == 1
    assert _values(alice.get(f"/v1/users/u5/channels/{INBOX}/peek").json()) == ["hello u5"]


# --- system publish -----------------------------------------------------------------------


def test_system_publish_needs_a_yaml_system_channel(alice: httpx.Client) -> None:
    _error(alice.post(f"/v1/_channels/{BOARD}", json={"payload": 1}), 403, "non_system_channel")
    _error(alice.post("/v1/_channels/_system/chanapi-none", json={"payload": 1}), 404, "channel_not_declared")
    ChannelDef.objects.create(tenant_id="acme", name="_system/chanapi-rt", source=DefSource.RUNTIME)
    _error(alice.post("/v1/_channels/_system/chanapi-rt", json={"payload": 1}), 404, "channel_not_declared")
    _error(alice.post("/v1/_channels/_system/chanapi/per-user", json={"payload": 1}), 501, "channel_scope_unsupported")
    _error(alice.post(f"/v1/_channels/{SYSTEM}", json={}), 400, "missing_payload")

    resp = alice.post(f"/v1/_channels/{SYSTEM}", json={"payload": {"disk": "full"}})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert out["channel"] == SYSTEM and out["msg_id"].startswith("msg_")
    assert _peek(alice, SYSTEM) == [{"disk": "full"}]
    row = ChannelMessage.objects.get(id=out["msg_id"])
    assert (row.published_by, row.published_by_user_id) == ("_admin", "_admin")


# --- per-user streams ---------------------------------------------------------------------


def test_per_user_streams_and_isolation(alice: httpx.Client, web: str, people: dict[str, dict[str, str]]) -> None:
    resp = alice.post(f"/v1/users/u1/channels/{INBOX}/publish", json={"payload": "for u1"})
    assert resp.status_code == 200 and resp.json()["channel"] == INBOX, resp.text
    assert alice.post(f"/v1/users/u2/channels/{INBOX}/subscribe").json()["messages"] == []
    got = alice.post(f"/v1/users/u1/channels/{INBOX}/subscribe", json={"max_messages": 5}).json()
    assert _values(got) == ["for u1"]
    assert alice.post(f"/v1/users/u1/channels/{INBOX}/ack", json={"cursor": got["next_cursor"]}).json() == {"ok": True}
    assert _values(alice.get(f"/v1/users/u1/channels/{INBOX}/peek").json()) == ["for u1"]

    _error(alice.post(f"/v1/_channels/{INBOX}/publish", json={"payload": 1}), 400, "channel_scope_invalid")
    _error(alice.post(f"/v1/_channels/{INBOX}/subscribe"), 400, "channel_scope_invalid")
    _error(alice.post("/v1/_channels/chanapi-agentbox/publish", json={"payload": 1}), 400, "channel_scope_invalid")
    _error(alice.post(f"/v1/users/u1/channels/{BOARD}/publish", json={"payload": 1}), 400, "channel_scope_invalid")
    _error(alice.get(f"/v1/users/bad.id/channels/{INBOX}/peek"), 400, "invalid_user_id")

    with _client(web, _isolated("u1")) as u1:
        assert _values(u1.get(f"/v1/users/u1/channels/{INBOX}/peek").json()) == ["for u1"]
        mine = u1.post(f"/v1/users/u1/channels/{INBOX}/publish", json={"payload": "from u1"}).json()
        assert ChannelMessage.objects.get(id=mine["msg_id"]).published_by_user_id == "u1"
        _error(u1.get(f"/v1/users/u2/channels/{INBOX}/peek"), 404, "unknown_channel")
        _error(u1.post(f"/v1/users/u2/channels/{INBOX}/publish", json={"payload": 1}), 404, "unknown_channel")
        _error(u1.post(f"/v1/users/u2/channels/{INBOX}/subscribe"), 404, "unknown_channel")
        _error(u1.post(f"/v1/_channels/{BOARD}/publish", json={"payload": 1}), 403, "insufficient_scope")
    with _client(web, people["bob"]) as bob:  # runs:create + runs:read, no channel scopes
        _error(bob.post(f"/v1/users/u1/channels/{INBOX}/publish", json={"payload": 1}), 403, "insufficient_scope")


# --- WebSocket ----------------------------------------------------------------------------


def _ws(web: str, name: str, headers: dict[str, str], **query: str) -> ClientConnection:
    qs = "&".join(f"{k}={quote(v, safe='')}" for k, v in query.items())
    url = web.replace("http://", "ws://") + f"/ws/channels/{name}/" + (f"?{qs}" if qs else "")
    return connect(url, additional_headers=headers, open_timeout=10)


def _frames(ws: ClientConnection, n: int, timeout: float = 10) -> list[dict[str, Any]]:
    return [json.loads(ws.recv(timeout=timeout)) for _ in range(n)]


def _close_code(ws: ClientConnection) -> int | None:
    with pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=10)
    return info.value.rcvd.code if info.value.rcvd is not None else None


def test_websocket_streams_new_messages_then_replays_from_a_cursor(
    alice: httpx.Client, web: str, people: dict[str, dict[str, str]]
) -> None:
    old = _publish(alice, BOARD, "before connect")
    with _ws(web, BOARD, people["alice"]) as ws:
        new = _publish(alice, BOARD, {"after": "connect"})
        frame = _frames(ws, 1)[0]
        assert frame["channel"] == BOARD and frame["id"] == new["msg_id"] and frame["value"] == {"after": "connect"}
        assert frame["published_at"].endswith("Z") and frame["cursor"].startswith("cur_")
        with pytest.raises(TimeoutError):
            ws.recv(timeout=0.5)  # the older message is not sent
    with _ws(web, BOARD, people["alice"], from_cursor="cur_0") as ws:
        replay = _frames(ws, 2)
    assert [f["id"] for f in replay] == [old["msg_id"], new["msg_id"]]
    with _ws(web, BOARD, people["alice"], from_cursor=replay[0]["cursor"]) as ws:
        assert [f["id"] for f in _frames(ws, 1)] == [new["msg_id"]]
    # the socket never commits: a subscribe still reads both
    assert len(alice.post(f"/v1/_channels/{BOARD}/subscribe").json()["messages"]) == 2


def test_websocket_sends_a_deferred_message_when_it_becomes_visible(
    alice: httpx.Client, web: str, people: dict[str, dict[str, str]]
) -> None:
    with _ws(web, BOARD, people["alice"]) as ws:
        due = datetime.now(UTC) + timedelta(seconds=1.2)
        _publish(alice, BOARD, "deferred", deliver_at=due.isoformat())
        frame = _frames(ws, 1, timeout=6)[0]
        assert frame["value"] == "deferred" and datetime.now(UTC) >= due - timedelta(milliseconds=50)


def test_websocket_user_streams_and_close_codes(
    alice: httpx.Client, web: str, people: dict[str, dict[str, str]]
) -> None:
    u1 = _isolated("u1")
    with _ws(web, INBOX, u1, user_id="u1") as ws:
        alice.post(f"/v1/users/u2/channels/{INBOX}/publish", json={"payload": "for u2"}).raise_for_status()
        alice.post(f"/v1/users/u1/channels/{INBOX}/publish", json={"payload": "for u1"}).raise_for_status()
        assert [f["value"] for f in _frames(ws, 1)] == ["for u1"]  # u2's message is not on u1's stream
    with _ws(web, INBOX, u1, user_id="u2") as ws:
        assert _close_code(ws) == 4404
    with _ws(web, INBOX, people["alice"]) as ws:  # a user-scoped channel needs ?user_id=
        assert _close_code(ws) == 4400
    with _ws(web, "chanapi-undeclared", people["alice"]) as ws:
        assert _close_code(ws) == 4404
    with _ws(web, BOARD, people["alice"], from_cursor="bogus") as ws:
        assert _close_code(ws) == 4400
    with _ws(web, BOARD, {"authorization": "Bearer not-a-token"}) as ws:
        assert _close_code(ws) == 4401
    with _ws(web, BOARD, people["bob"]) as ws:  # no channel:read
        assert _close_code(ws) == 4403


def _listeners(name: str) -> int:
    """Redis subscribers of a channel's doorbell (the Daphne hub holds one while anyone waits)."""
    return int(sync_client().pubsub_numsub(bell("acme", name))[0][1])


def test_a_hung_up_long_poll_or_socket_releases_its_doorbell(
    alice: httpx.Client, web: str, people: dict[str, dict[str, str]]
) -> None:
    outcome: list[BaseException] = []

    def hang_up() -> None:
        with _client(web, people["alice"]) as impatient:
            impatient.timeout = httpx.Timeout(30, read=2.0)
            try:
                impatient.post(f"/v1/_channels/{BOARD}/subscribe", json={"wait_ms": 20_000})
            except httpx.ReadTimeout as exc:  # the client gives up long before the 20 s wait
                outcome.append(exc)

    waiter = threading.Thread(target=hang_up)
    waiter.start()
    wait_for(lambda: _listeners(BOARD) == 1, timeout=5)  # the long-poll holds the doorbell
    waiter.join(timeout=10)
    assert len(outcome) == 1
    wait_for(lambda: _listeners(BOARD) == 0, timeout=5)  # released on hang-up, not after 20 s
    with _ws(web, BOARD, people["alice"]):
        assert _listeners(BOARD) == 1
    wait_for(lambda: _listeners(BOARD) == 0, timeout=5)
