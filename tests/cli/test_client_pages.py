"""loomcycle_http.client's iterators over cursor-paginated lists, and the routes the client gained
(sessions, interrupts, fork, compact), against a real web process: every row once, newest first,
one request per page."""

from __future__ import annotations

import asyncio

import pytest

from apps.runs.models import Run, RunStatus
from loomcycle_http.client import AsyncClient, Client, LoomcycleError
from tests.cli.conftest import Web, script
from tests.conftest import wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")


def _runs(lc: Client, user: str, n: int) -> list[str]:
    return [lc.runs.create("scripted", script({"text": f"r{i}"}), user_id=user).run_id for i in range(n)]


def test_runs_iter_follows_next_cursor_over_every_page(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        ids = _runs(lc, "u-pages", 5)
        listed = [r["run_id"] for r in lc.runs.iter(user_id="u-pages", page_size=2)]
        assert listed == ids[::-1]  # three pages of 2, 2 and 1, newest first, none repeated
        assert [r["run_id"] for r in lc.runs.iter(user_id="u-pages", page_size=100)] == ids[::-1]
        assert list(lc.runs.iter(user_id="u-nobody")) == []


def test_children_and_sessions_iterate_every_page(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        parent, *kids = _runs(lc, "u-kids", 4)
        Run.objects.filter(id__in=kids).update(parent_id=parent, depth=1)  # as Agent spawns record them
        assert [r["run_id"] for r in lc.runs.children(parent, page_size=2)] == kids[::-1]
        top = _runs(lc, "u-sessions", 4)  # each its own session (a sub-run's session is not listed)
        for run_id in top:  # ended: the sessions' latest activity, their order, holds still
            assert wait_status(run_id, RunStatus.COMPLETED).status == RunStatus.COMPLETED
        paged = [s["session_id"] for s in lc.sessions.iter(user_id="u-sessions", page_size=3)]  # two pages
        whole = list(lc.sessions.iter(user_id="u-sessions"))
        assert paged == [s["session_id"] for s in whole] and len(set(paged)) == 4
        assert {s["last_run_id"] for s in whole} == set(top)


async def _async_pages(url: str, parent: str) -> tuple[list[str], list[str]]:
    async with AsyncClient(url) as lc:
        runs = [r["run_id"] async for r in lc.runs.iter(user_id="u-async", page_size=2)]
        kids = [r["run_id"] async for r in lc.runs.children(parent, page_size=1)]
        return runs, kids


def test_the_async_client_iterates_runs_and_children(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        parent, *kids = _runs(lc, "u-async", 3)
    Run.objects.filter(id__in=kids).update(parent_id=parent, depth=1)
    runs, children = asyncio.run(_async_pages(web_proc.url, parent))
    assert runs == [*kids[::-1], parent] and children == kids[::-1]


def test_a_sessions_transcript_replay_fork_and_compact(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        ref = lc.runs.create("scripted", script({"text": "one"}), user_id="u-sess")
        assert wait_status(ref.run_id, RunStatus.COMPLETED).status == RunStatus.COMPLETED
        transcript = lc.sessions.transcript(ref.session_id)
        assert transcript["session"]["id"] == ref.session_id
        assert [r["run_id"] for r in transcript["runs"]] == [ref.run_id]
        assert transcript["events"][0]["type"] == "user_input" and "payload" in transcript["events"][0]
        replayed = lc.sessions.replay(ref.session_id)
        assert replayed["new_session_id"] != ref.session_id and replayed["events_copied"] > 0
        forked = lc.runs.fork(ref.run_id, 0, prompt=script({"text": "two"}))
        assert forked["forked_from_run"] == ref.run_id and forked["session_id"] != ref.session_id
        with pytest.raises(LoomcycleError) as ended:
            lc.runs.compact(ref.run_id)
        assert ended.value.status == 409  # an ended run has no next iteration to compact before


def test_interrupts_of_a_run_and_a_users_inbox(web_proc: Web) -> None:
    ask = {"tool": "Interruption", "input": {"op": "ask", "question": "which?", "options": ["a", "b"]}}
    with Client(web_proc.url) as lc:
        ref = lc.runs.create("asker", script(ask, {"text": "done"}), user_id="u-ask")
        wait_status(ref.run_id, RunStatus.AWAITING_INTERRUPT)
        [pending] = lc.interrupts.of_run(ref.run_id)
        assert pending["question"] == "which?" and pending["status"] == "pending"
        assert [i["interrupt_id"] for i in lc.interrupts.inbox("u-ask")] == [pending["interrupt_id"]]
        answered = lc.interrupts.resolve(ref.run_id, pending["interrupt_id"], answer="a")
        assert answered["status"] == "resolved"
        assert lc.interrupts.inbox("u-ask") == []


def test_memory_keys_lists_the_slots_entries(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        lc.memory.set("user", "u-keys", "notes/a", {"n": 1})
        lc.memory.set("user", "u-keys", "notes/b", [2])
        lc.memory.set("user", "u-keys", "other", "x")
        entries = lc.memory.keys("user", "u-keys", prefix="notes/")
        assert [(e["key"], e["value"], e["embedded"]) for e in entries] == [
            ("notes/a", {"n": 1}, False),
            ("notes/b", [2], False),
        ]


def test_a_runtime_channel_created_subscribed_acked_and_deleted(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        made = lc.channels.create("client/jobs", description="jobs", max_messages=10)
        assert (made["name"], made["source"], made["max_messages"]) == ("client/jobs", "runtime", 10)
        first = lc.channels.publish("client/jobs", {"n": 1})
        lc.channels.publish("client/jobs", {"n": 2})
        read = lc.channels.subscribe("client/jobs", from_cursor="cur_0", max_messages=1)
        assert [m["id"] for m in read["messages"]] == [first["msg_id"]]
        lc.channels.ack("client/jobs", read["next_cursor"])
        assert [m["value"] for m in lc.channels.subscribe("client/jobs")["messages"]] == [{"n": 2}]
        lc.channels.delete("client/jobs")
        assert "client/jobs" not in {c["name"] for c in lc.channels.list()}


def test_snapshots_captured_listed_read_and_deleted(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        made = lc.snapshots.capture(label="client-snap")
        assert made["label"] == "client-snap" and made["byte_size"] > 0
        assert [s["id"] for s in lc.snapshots.list(label_contains="client-snap")] == [made["id"]]
        read = lc.snapshots.get(made["id"])
        assert read["envelope"]["format"] == "loomcycle-snapshot" and read["envelope"]["id"] == made["id"]
        lc.snapshots.delete(made["id"])
        assert lc.snapshots.list(label_contains="client-snap") == []
