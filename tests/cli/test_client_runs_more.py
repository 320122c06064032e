"""The client's run routes beyond start/stream/read (batch, delete, a run's completion webhooks,
a user's runs and their state stream, a session's next message), the gateway, and the channel
routes past publish/subscribe, against a real web process and the session's workers."""

from __future__ import annotations

import asyncio

import pytest

from apps.runs.models import Run, RunStatus
from loomcycle_http.client import AsyncClient, Client, Conflict, NotFound
from tests.cli.conftest import Web, script
from tests.conftest import wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")


def test_a_batch_joined_and_detached_then_deleted(web_proc: Web) -> None:
    spawns = [{"agent": "scripted", "prompt": script({"text": f"b{i}"}), "user_id": "u-batch"} for i in range(2)]
    with Client(web_proc.url) as lc:
        joined = lc.runs.batch(spawns, timeout_ms=60_000)
        assert [r["status"] for r in joined["results"]] == ["completed", "completed"]
        assert [r["final_text"] for r in joined["results"]] == ["b0", "b1"]
        detached = lc.runs.batch(spawns[:1], mode="detach")["results"][0]
        assert detached["status"] in ("running", "queued") and detached["run_id"]
        wait_status(detached["run_id"], RunStatus.COMPLETED)
        mine = {r["run_id"] for r in lc.runs.of_user("u-batch", status="all")}
        assert mine == {*(r["run_id"] for r in joined["results"]), detached["run_id"]}
        assert lc.runs.webhooks(detached["run_id"]) == []  # it asked for none
        gone = lc.runs.delete(detached["run_id"])
        assert (gone["deleted"], gone["deleted_runs"]) == (True, 1)
        with pytest.raises(NotFound):
            lc.runs.get(detached["run_id"])


def test_deleting_a_live_run_is_refused_unless_cancelled_first(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        ref = lc.runs.create("scripted", script({"sleep_ms": 60_000, "text": "never"}))
        with pytest.raises(Conflict) as live:
            lc.runs.delete(ref.run_id)
        assert live.value.code == "run_live"
        answer = lc.runs.delete(ref.run_id, cancel=True)
        assert answer["deleted"] or answer["deleting"]
    wait_for(lambda: not Run.objects.filter(id=ref.run_id).exists(), timeout=30)  # deleted once the cancel ends it


def test_watch_user_streams_the_states_of_a_users_runs(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        states = lc.runs.watch_user("u-watch")
        opened = next(states)
        assert (opened.type, opened.data["user_id"]) == ("stream_open", "u-watch")
        ref = lc.runs.create("scripted", script({"text": "watched"}), user_id="u-watch")
        seen = []
        for event in states:
            assert event.type == "run_state" and event.data["run_id"] == ref.run_id
            seen.append(event.data["state"])
            if event.data["state"] == "completed":
                break
        states.close()  # hangs up: the stream would otherwise last 30 minutes
        assert seen[-1] == "completed"


def test_a_sessions_next_message_streamed_and_in_the_background(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        first = lc.runs.create("scripted", script({"text": "one"}), user_id="u-msg")
        wait_status(first.run_id, RunStatus.COMPLETED)
        events = list(lc.sessions.message(first.session_id, script({"text": "two"})))
        assert "".join(e.text for e in events if e.type == "text") == "two" and events[-1].type == "done"
        ref = lc.sessions.create_message(first.session_id, script({"text": "three"}))
        assert ref.session_id == first.session_id
        wait_status(ref.run_id, RunStatus.COMPLETED)
        turns = lc.sessions.transcript(first.session_id)["runs"]
        assert [t["turn"] for t in turns] == [0, 1, 2]


def test_the_gateway_lists_models_and_answers_chat_and_embeddings(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        assert "steady" in {m["id"] for m in lc.gateway.models()}  # the test yaml's alias
        hi = [{"role": "user", "content": "hi"}]
        completion = lc.gateway.chat_completions(model="steady", messages=hi)
        assert completion["object"] == "chat.completion" and completion["choices"][0]["message"]["content"]
        native = lc.gateway.chat(provider="mock", model="mock-generic", messages=hi)
        assert native["content"]
        vectors = lc.gateway.embeddings(["a", "b"])
        assert [d["index"] for d in vectors["data"]] == [0, 1]


def test_channel_admin_per_user_broadcast_and_await(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        lc.channels.create("client/admin", description="before")
        assert lc.channels.update("client/admin", description="after")["description"] == "after"
        sent = lc.channels.broadcast(["client/admin", "handoff/a"], {"n": 1})
        assert sent["published"] == 2
        woke = lc.channels.await_any(["client/admin"], from_cursor="cur_0", wait_ms=0)
        assert woke["results"]["client/admin"]["messages"][0]["value"] == {"n": 1}
        assert lc.channels.purge("client/admin")["purged"] == 1
        lc.channels.delete("client/admin")
        lc.channels.publish("per-user", {"for": "u-ch"}, user_id="u-ch")
        read = lc.channels.subscribe("per-user", user_id="u-ch", from_cursor="cur_0")
        assert [m["value"] for m in read["messages"]] == [{"for": "u-ch"}]
        lc.channels.ack("per-user", read["next_cursor"], user_id="u-ch")
        assert lc.channels.peek("per-user", user_id="someone-else") == []
        assert lc.channels.system_publish("_system/alarms", {"a": 1})["msg_id"]
        assert "user" in lc.memory.scopes()


async def _async_more(url: str) -> tuple[list[str], list[str], str]:
    async with AsyncClient(url) as lc:
        batch = await lc.runs.batch([{"agent": "scripted", "prompt": script({"text": "x"})}], timeout_ms=60_000)
        run_id = batch["results"][0]["run_id"]
        deleted = await lc.runs.delete(run_id)
        models = [m["id"] for m in await lc.gateway.models()]
        states = lc.runs.watch_user("u-async-watch")
        opened = await anext(states)
        await states.aclose()
        return [str(deleted["deleted"])], models, opened.type


def test_the_async_client_batches_deletes_lists_models_and_watches(web_proc: Web) -> None:
    deleted, models, opened = asyncio.run(_async_more(web_proc.url))
    assert deleted == ["True"] and "steady" in models and opened == "stream_open"
