"""The client's definition kinds, volumes, tokens, hooks, schedules, inbound-webhook admin,
retention, erasure, snapshot export/restore and runtime reads against a real web process (open
mode: the caller is an admin of the shared tenant), sync and async."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from apps.substrate import tokens
from loomcycle_http.client import AsyncClient, Client, NotFound
from tests.cli.conftest import Web

pytestmark = pytest.mark.usefixtures("agents", "stack")


def test_a_skill_created_forked_verified_promoted_and_retired(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        v1 = lc.skills.create("client-skill", {"description": "d", "body": "Summarise."})
        assert v1["version"] == 1 and v1["content_sha256"].startswith("sha256:")
        v2 = lc.skills.fork("client-skill", {"body": "Summarise briefly."}, description="shorter")
        assert (v2["version"], v2["promoted"], v2["parent_def_id"]) == (2, False, v1["def_id"])
        assert lc.skills.verify("client-skill", v1["content_sha256"])["matches"] is True
        assert lc.skills.promote(v2["def_id"])["promoted"] is True
        assert lc.skills.version(v2["def_id"])["promoted"] is True
        assert [v["version"] for v in lc.skills.versions("client-skill")] == [2, 1]
        assert lc.skills.retire(v1["def_id"])["retired"] is True
        [named] = [n for n in lc.skills.names() if n["name"] == "client-skill"]
        assert (named["version_count"], named["active_def_id"]) == (2, v2["def_id"])
        server = lc.mcp_servers.create(
            "client-mcp", {"url": "https://example.com/mcp", "transport": "http"}, discover=False
        )
        assert server["name"] == "client-mcp" and "discovery" not in server


def test_a_schedule_defined_then_read_paused_resumed_and_run_now(web_proc: Web) -> None:
    overlay = {"agent": "echo", "schedule": "0 0 1 1 *", "prompt": "tick", "enabled": True}
    with Client(web_proc.url) as lc:
        row = lc.schedule_defs.create("client-nightly", overlay)
        assert row["def_id"] in {s["def_id"] for s in lc.schedules.list()}
        assert lc.schedules.state(row["def_id"])["name"] == "client-nightly"
        assert lc.schedules.pause(row["def_id"]) == {"def_id": row["def_id"], "paused": True}
        assert lc.schedules.state(row["def_id"])["paused_until"] is not None
        assert lc.schedules.resume(row["def_id"]) == {"def_id": row["def_id"], "paused": False}
        assert lc.schedules.run_now(row["def_id"])["scheduled"] == "next-tick"
        with pytest.raises(NotFound):
            lc.schedules.state("def_0000000000000000")


def test_an_inbound_webhook_defined_dry_run_and_its_deliveries(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        lc.webhook_defs.create("client-hook", {"agent": "echo", "auth": {"signing_secret_env": "LOOMCYCLE_WH_SECRET"}})
        assert "client-hook" in {n["name"] for n in lc.webhook_defs.names()}
        dry = lc.webhooks.test("client-hook", {"hello": "world"})
        assert dry["would_accept"] in (True, False) and dry["run_input_preview"]["agent"] == "echo"
        assert lc.webhooks.deliveries("client-hook") == []  # a dry run records nothing


def test_tool_hooks_registered_listed_and_deleted(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        hook_id = lc.hooks.register("client", "audit", "pre", "http://localhost:9/", tools=["NoSuchTool"])
        assert hook_id.startswith("hook_") and hook_id in {h["id"] for h in lc.hooks.list()}
        lc.hooks.delete(hook_id)
        assert hook_id not in {h["id"] for h in lc.hooks.list()}
        with pytest.raises(NotFound):
            lc.hooks.delete(hook_id)


def test_volumes_and_the_runtimes_reads(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        made = lc.volumes.op("create", "client-vol", mode="ro")
        assert (made["name"], made["mode"]) == ("client-vol", "ro")
        assert "client-vol" in {v["name"] for v in lc.volumes.list()}
        assert lc.volumes.op("purge", "client-vol")["purged"] is True
        me = lc.runtime.me()
        assert me["is_admin"] is True and me.get("open_mode") is True
        assert isinstance(lc.runtime.concurrency(), dict)


def test_the_presets_and_the_env_template(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        units = {u["name"]: u["kind"] for u in lc.config.presets()}
        assert units["base"] == "preset"
        assert lc.config.preset("base").strip()
        with pytest.raises(NotFound) as unknown:
            lc.config.preset("no-such-unit")
        assert unknown.value.code == "unknown_preset"
        assert "LOOMCYCLE_" in lc.config.env_template()


def test_operator_tokens_minted_listed_and_retired(web_proc: Web) -> None:
    admin = tokens.token_create(name="root", tenant_id="ops")["token"]  # a token ends open mode: use it
    with Client(web_proc.url, token=admin) as lc:
        made = lc.tokens.op("create", name="client-bot", tenant_id="acme", scopes=["runs:read"])
        assert made["token"].startswith("lct_") and made["state"] == "live"
        assert {"root", "client-bot"} <= {n["name"] for n in lc.tokens.names()}
        assert lc.tokens.op("retire", name="client-bot")["retired"] is True
        assert lc.runtime.me()["subject"] == "tok-root"


def test_retention_set_and_removed_and_a_persons_erasure(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        lc.retention.set(7, agent="echo")
        policies = lc.retention.get()["policies"]
        assert {"agent": "echo", "max_age_days": 7, "source": "api"} in policies
        lc.retention.delete(agent="echo")
        assert not [p for p in lc.retention.get()["policies"] if p["agent"] == "echo" and p["source"] == "api"]
        lc.memory.set("user", "u-erase", "k", "v")
        held = lc.erasure.report("u-erase")["tier1_covered"]["counts"]
        assert held["memory.MemoryEntry"] == 1
        assert lc.erasure.erase("u-erase")["dry_run"] is True  # the default: a report
        done = lc.erasure.erase("u-erase", dry_run=False)
        assert (done["status"], done["deleted"]["memory.MemoryEntry"]) == ("done", 1)
        with pytest.raises(NotFound):
            lc.memory.get("user", "u-erase", "k")


def test_a_snapshot_exported_and_restored_by_id_and_inline(web_proc: Web) -> None:
    with Client(web_proc.url) as lc:
        lc.memory.set("user", "u-snap", "k", {"kept": True})
        made = lc.snapshots.capture(label="client-export")
        envelope = lc.snapshots.export(made["id"])
        assert envelope["id"] == made["id"] and envelope == lc.snapshots.get(made["id"])["envelope"]
        lc.memory.delete("user", "u-snap", "k")
        restored = lc.snapshots.restore(made["id"])
        assert restored["memory_restored"] >= 1 and lc.memory.get("user", "u-snap", "k") == {"kept": True}
        again = lc.snapshots.restore("ignored", envelope=envelope)  # inline: the path id is not looked up
        assert all(count == 0 for count in again.values())
        lc.snapshots.delete(made["id"])


async def _async_admin(url: str) -> dict[str, Any]:
    async with AsyncClient(url) as lc:
        skill = await lc.skills.create("client-async-skill", {"description": "d", "body": "B."})
        hook_id = await lc.hooks.register("client", "async", "post", "http://localhost:9/", tools=["NoSuchTool"])
        await lc.hooks.delete(hook_id)
        snap = await lc.snapshots.capture(label="client-async")
        exported = await lc.snapshots.export(snap["id"])
        await lc.snapshots.delete(snap["id"])
        await lc.budgets.set_limit("user", "u-async-budget", hard_limit=1000)
        limits = [r for r in await lc.budgets.limits() if r["scope_id"] == "u-async-budget"]
        await lc.budgets.delete_limit("user", "u-async-budget")
        sessions = [s async for s in lc.sessions.iter(user_id="u-nobody-async")]
        presets = [u["name"] for u in await lc.config.presets()]
        return {
            "skill": skill["version"],
            "export": exported["id"] == snap["id"],
            "retention": (await lc.retention.get())["tenant"],
            "erasure": (await lc.erasure.report("u-nobody-async"))["subject"],
            "me": (await lc.runtime.me())["is_admin"],
            "limits": [r["hard_limit"] for r in limits],
            "sessions": sessions,
            "inbox": await lc.interrupts.inbox("u-nobody-async"),
            "scopes": "user" in await lc.memory.scopes(),
            "presets": "base" in presets and "LOOMCYCLE_" in await lc.config.env_template(),
        }


def test_the_async_client_reaches_the_same_resources(web_proc: Web) -> None:
    got = asyncio.run(_async_admin(web_proc.url))
    assert got == {
        "skill": 1,
        "export": True,
        "retention": "",
        "erasure": "u-nobody-async",
        "me": True,
        "limits": [1000],
        "sessions": [],
        "inbox": [],
        "scopes": True,
        "presets": True,
    }
