"""loomcycle_http.client against a real web process: typed errors with the API's code, and the
async client's runs, memory and channels (the sync client is exercised by test_cli.py)."""

from __future__ import annotations

import asyncio

import pytest

from apps.substrate.models import AgentDef
from loomcycle_http.client import AsyncClient, BadRequest, Client, ConnectionFailed, LoomcycleError, NotFound
from tests.cli.conftest import Web, script

pytestmark = pytest.mark.usefixtures("agents", "stack")


def test_refusals_are_typed_errors_carrying_the_api_code(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        with pytest.raises(NotFound) as missing:
            lc.runs.get("r_0000000000000000")
        assert (missing.value.status, missing.value.code) == (404, "not_found")
        with pytest.raises(BadRequest) as unknown:
            next(iter(lc.runs.start("no-such-agent", "hi")))
        assert unknown.value.code == "unknown_agent"
    with Client("http://127.0.0.1:9") as nowhere, pytest.raises(ConnectionFailed):
        nowhere.runs.list()


async def _async_round_trip(url: str) -> None:
    async with AsyncClient(url) as lc:
        events = [e async for e in lc.runs.start("scripted", script({"text": "async hi"}))]
        assert "".join(e.text for e in events if e.type == "text") == "async hi"  # live pieces + the committed rest
        run_id = str(next(e.data["run_id"] for e in events if e.type == "agent"))
        assert (await lc.runs.get(run_id))["state"] == "completed"
        stored = [e.type async for e in lc.runs.events(run_id)]
        assert stored[0] == "user_input" and stored[-1] == "done"

        ref = await lc.runs.create("scripted", script({"sleep_ms": 60_000, "text": "never"}))
        assert (await lc.runs.cancel(ref.agent_id, reason="enough"))["cancelled"] is True
        tail = [e async for e in lc.runs.stream(ref.run_id)]
        assert tail[-1].type == "done" and tail[-1].data["stop_reason"] == "enough"

        await lc.memory.set("user", "u2", "k", [1, 2])
        assert await lc.memory.get("user", "u2", "k") == [1, 2]
        sent = await lc.channels.publish("handoff", {"n": 1})
        assert [m["id"] for m in await lc.channels.peek("handoff")] == [sent["msg_id"]]


def test_the_async_client_runs_reads_and_cancels(web_proc: Web) -> None:
    asyncio.run(_async_round_trip(web_proc.url))


async def _async_apply(url: str) -> dict[str, object]:
    async with AsyncClient(url) as lc:
        return await lc.agents.apply("scripted", {"system_prompt": "forked"})


def test_apply_refuses_a_static_name_in_the_shared_tenant(web_proc: Web) -> None:
    """Open mode is the shared tenant, where the yaml entry outranks every runtime version."""
    with Client(web_proc.url) as lc, pytest.raises(LoomcycleError) as sync_refused:
        lc.agents.apply("scripted", {"system_prompt": "forked"})
    with pytest.raises(LoomcycleError) as async_refused:
        asyncio.run(_async_apply(web_proc.url))
    assert sync_refused.value.code == async_refused.value.code == "static_in_shared_tenant"
    assert not AgentDef.objects.filter(name="scripted", source="runtime").exists()  # nothing was written
