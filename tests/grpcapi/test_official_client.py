"""loomcycle's official client (PyPI loomcycle==1.124.0, unchanged, installed under its own name:
requirements/dev.txt) against the real stack through the gRPC server: a streamed run with
nested trusted-text segments and its RunHandle, an interactive run steered and cancelled, a
continued session, its transcript, a re-attached stream, an AgentDef created, read and run,
a user's runs, pause/resume with a run refused meanwhile, and the client's typed exceptions
(unknown agent, unknown run, wrong token, backpressure) from this runtime's statuses."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loomcycle import LoomcycleClient, RunHandle
from loomcycle import errors as lc

from apps.runs.models import RunStatus
from tests.conftest import wait_status
from tests.factories.grpc import grpc_server

pytestmark = pytest.mark.usefixtures("agents", "stack")


def hi(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "trusted-text", "text": text}]}]


async def _collect(stream: Any) -> list[Any]:
    return [event async for event in stream]


def test_a_streamed_run_its_handle_session_transcript_and_reattach(grpc_target: str) -> None:
    async def main() -> None:
        handles: list[RunHandle] = []
        async with LoomcycleClient(target=grpc_target) as client:
            events = await _collect(
                client.run_streaming(agent="echo", segments=hi("hi"), user_id="dora", on_handle=handles.append)
            )
            assert [e.type for e in events] == ["started", "text", "usage", "done"]
            assert events[1].text == "ok" and events[-1].stop_reason == "end_turn"
            (handle,) = handles
            assert handle.run_id.startswith("r_") and handle.session_id.startswith("s_")
            run = await client.get_run(handle.run_id)
            assert (run["status"], run["agent_id"], run["agent"]) == ("completed", handle.agent_id, "echo")
            assert (await client.get_agent(handle.agent_id))["run_id"] == handle.run_id
            more = await _collect(client.continue_session(session_id=handle.session_id, segments=hi("again")))
            assert more[-1].type == "done"
            transcript = await client.get_transcript(handle.session_id)
            assert len({e["run_id"] for e in transcript}) == 2
            replay = await _collect(client.stream_run(handle.run_id, from_seq=0))
            assert [e.type for e in replay][-3:] == ["text", "usage", "done"]
            mine = await client.list_user_agents("dora", status="all")
            assert {a["run_id"] for a in mine} >= {handle.run_id}

    asyncio.run(main())


def test_an_interactive_run_steered_with_run_input_then_cancelled(grpc_target: str) -> None:
    async def main() -> str:
        handles: list[RunHandle] = []
        async with LoomcycleClient(target=grpc_target) as client:
            stream = client.run_streaming(
                agent="chat", segments=hi("hello"), interactive=True, on_handle=handles.append
            )
            async for event in stream:
                if event.type == "awaiting_input":
                    break
            run_id = handles[0].run_id
            assert (await client.run_input(run_id, "and then?"))["delivered"] is True
            async for event in stream:
                if event.type == "awaiting_input":
                    break
            assert await client.cancel_agent(handles[0].agent_id, reason="enough") == 1  # cancelled_count
            await stream.aclose()
        return run_id

    wait_status(asyncio.run(main()), RunStatus.CANCELLED)


def test_agent_def_created_read_and_run(grpc_target: str) -> None:
    async def main() -> None:
        async with LoomcycleClient(target=grpc_target) as client:
            overlay = {"description": "made over gRPC", "provider": "mock", "model": "mock-generic"}
            created = await client.agent_def({"op": "create", "name": "grpc-made", "overlay": overlay})
            got = await client.agent_def({"op": "get", "def_id": created["def_id"]})
            assert got["def_id"] == created["def_id"] and got["name"] == "grpc-made"
            events = await _collect(client.run_streaming(agent="grpc-made", segments=hi("hi")))
            assert events[-1].type == "done"
            with pytest.raises(lc.SubstrateToolRefusedError) as refused:
                await client.agent_def({"op": "create", "name": "grpc-bad", "overlay": {"provider": "mock"}})
            assert refused.value.tool == "AgentDef" and "provider and model" in refused.value.message
            made = await client.volume_def({"op": "create", "name": "grpc-vol"})
            assert made["name"] == "grpc-vol"
            assert "grpc-vol" in {v["name"] for v in (await client.volume_def({"op": "list"}))["volumes"]}

    asyncio.run(main())


def test_memory_set_get_list_delete(grpc_target: str) -> None:
    async def main() -> None:
        async with LoomcycleClient(target=grpc_target) as client:
            await client.memory({"op": "set", "scope": "user", "key": "tone", "value": "concise", "ttl": 600})
            got = await client.memory({"op": "get", "scope": "user", "key": "tone"})
            assert got["entry"]["value"] == "concise" and got["scope_id"] == "open-mode"  # the caller's own user
            listed = await client.memory({"op": "list", "scope": "user", "prefix": "to"})
            assert [e["key"] for e in listed["entries"]] == ["tone"]
            assert (await client.memory({"op": "delete", "scope": "user", "key": "tone"}))["deleted"] is True
            with pytest.raises(lc.AgentNotFoundError):  # NOT_FOUND, as GET's 404 (the client names it so)
                await client.memory({"op": "get", "scope": "user", "key": "tone"})
            with pytest.raises(lc.SubstrateToolRefusedError) as refused:
                await client.memory({"op": "incr", "scope": "user", "key": "n"})
            assert "op must be one of" in refused.value.message

    asyncio.run(main())


def test_channels_publish_peek_subscribe_ack_await_broadcast(grpc_target: str) -> None:
    async def main() -> None:
        async with LoomcycleClient(target=grpc_target) as client:
            assert "notes" in {c["name"] for c in await client.list_channels()}
            sent = await client.publish_channel("notes", payload=b'{"n": 1}')
            assert sent["msg_id"].startswith("msg_") and sent["channel"] == "notes"
            peeked = await client.peek_channel("notes")
            assert [m["value"] for m in peeked["messages"]] == [b'{"n": 1}']
            got = await client.subscribe_channel("notes", from_cursor="cur_0")
            assert len(got["messages"]) == 1 and got["next_cursor"].startswith("cur_")
            assert (await client.subscribe_channel("notes"))["messages"] == []  # the cursor was committed
            await client.ack_channel("notes", cursor=got["next_cursor"])
            mine = await client.publish_channel("per-user", payload=b'"hi"', scope="user", scope_id="erin")
            assert mine["channel"] == "per-user"
            fanned = await client.broadcast_channels(["notes", "capped"], payload=b"2")
            assert (fanned["published"], fanned["failed"]) == (2, 0)
            waited = await client.await_channels(["notes", "capped"], mode="all", from_cursor=got["next_cursor"])
            assert waited["satisfied"] and waited["total_messages"] == 2
            with pytest.raises(lc.AgentNotFoundError):  # NOT_FOUND: an undeclared channel, as REST's 404
                await client.publish_channel("no-such-channel", payload=b"1")
            with pytest.raises(lc.InvalidArgumentError):
                await client.publish_channel("notes", payload=b"{not json")

    asyncio.run(main())


def test_spawn_run_batch_join_and_detach(grpc_target: str) -> None:
    async def main() -> None:
        async with LoomcycleClient(target=grpc_target) as client:
            joined = await client.spawn_run_batch(
                [{"agent": "echo", "segments": hi("a")}, {"agent": "echo", "segments": hi("b")}]
            )
            assert joined["spawned"] == 2 and [r["status"] for r in joined["results"]] == ["completed", "completed"]
            assert [r["final_text"] for r in joined["results"]] == ["ok", "ok"]
            detached = await client.spawn_run_batch([{"agent": "echo", "segments": hi("c")}], mode="detach")
            assert detached["spawned"] == 1 and detached["results"][0]["run_id"].startswith("r_")
            with pytest.raises(lc.InvalidArgumentError):
                await client.spawn_run_batch([{"agent": "echo", "segments": hi("d")}], mode="sideways")

    asyncio.run(main())


def test_pause_refuses_runs_until_resume(grpc_target: str) -> None:
    async def main() -> None:
        async with LoomcycleClient(target=grpc_target) as client:
            paused = await client.pause_runtime(timeout_ms=5000)
            try:
                assert paused["status"] == "paused"
                assert (await client.get_runtime_state())["status"] == "paused"
                with pytest.raises(lc.AlreadyPausingError):
                    await client.pause_runtime(timeout_ms=10)
                with pytest.raises(lc.UnavailableError) as refused:
                    await _collect(client.run_streaming(agent="echo", segments=hi("while paused")))
                assert refused.value.reason == "runtime_paused" and refused.value.retryable
            finally:
                await client.resume_runtime()
            with pytest.raises(lc.NotPausedError):
                await client.resume_runtime()
            assert (await _collect(client.run_streaming(agent="echo", segments=hi("after"))))[-1].type == "done"

    asyncio.run(main())


def test_snapshots_list_get_export_delete(grpc_target: str) -> None:
    async def main() -> None:
        handles: list[RunHandle] = []
        async with LoomcycleClient(target=grpc_target) as client:
            live = client.run_streaming(agent="very-slow", segments=hi("busy"), on_handle=handles.append)
            await anext(aiter(live))
            try:  # a running runtime: captured, the live run named in warnings, not carried
                made = await client.create_snapshot(description="over grpc")
                assert any("not carried" in w for w in made["warnings"]), made
            finally:
                await client.cancel_agent(handles[0].agent_id)
                await live.aclose()
            listed = await client.list_snapshots()
            assert made["snapshot_id"] in {s["snapshot_id"] for s in listed}
            got = await client.get_snapshot(made["snapshot_id"])
            assert got["description"] == "over grpc" and got["size_bytes"] > 0
            exported = await client.export_snapshot(made["snapshot_id"])
            assert exported["checksum"].startswith("sha256:") and exported["raw_json"] == got["json_content"]
            assert await client.delete_snapshot(made["snapshot_id"]) is True
            with pytest.raises(lc.SnapshotNotFoundError):
                await client.get_snapshot(made["snapshot_id"])

    asyncio.run(main())


def test_typed_errors_unknown_agent_unknown_run_wrong_token(grpc_target: str, people: Any) -> None:
    async def main() -> None:
        async with LoomcycleClient(target=grpc_target, auth_token="lct_wrong") as stranger:
            with pytest.raises(lc.AuthError):
                await stranger.get_run("r_0000000000000000")
        token = people["bob"]["authorization"].removeprefix("Bearer ")
        async with LoomcycleClient(target=grpc_target, auth_token=token) as client:
            with pytest.raises(lc.InvalidArgumentError) as unknown:  # loomcycle: ErrUnknownAgent -> InvalidArgument
                await _collect(client.run_streaming(agent="no-such-agent", segments=hi("x")))
            assert unknown.value.reason == "unknown_agent"
            with pytest.raises(lc.AgentNotFoundError):
                await client.get_agent("a_0000000000000000")
            with pytest.raises(lc.SessionNotFoundError):
                await client.get_transcript("s_0000000000000000")

    asyncio.run(main())


CAPPED = {"LOOMCYCLE_MAX_CONCURRENT_RUNS": "1", "LOOMCYCLE_MAX_QUEUE_DEPTH": "0"}


@pytest.fixture
def capped_target(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """A second gRPC server whose admission allows one run at a time and queues none."""
    with grpc_server({**stack_env, **CAPPED}, logdir / "grpc-capped.log") as target:
        yield target


def test_backpressure_is_the_clients_backpressure_error(capped_target: str) -> None:
    async def main() -> None:
        handles: list[RunHandle] = []
        async with LoomcycleClient(target=capped_target) as client:
            holder = client.run_streaming(agent="very-slow", segments=hi("hold the slot"), on_handle=handles.append)
            await anext(aiter(holder))  # admitted: `started`
            try:
                with pytest.raises(lc.BackpressureError) as full:
                    await _collect(client.run_streaming(agent="echo", segments=hi("one too many")))
                assert full.value.reason == "backpressure" and full.value.retryable
                assert "queue full" in full.value.message
            finally:
                await client.cancel_agent(handles[0].agent_id)
                await holder.aclose()

    asyncio.run(main())
