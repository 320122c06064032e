"""loomcycle's MCP meta-tools beyond the first sixteen (issue 40): `spawn_run`'s per-run
options, `spawn_runs`, `list_runs`, `compact_run`, the snapshot, hook and remaining def
tools, each through the official SDK client over `/v1/_mcp` (and stdio) on the session's
Daphne and Celery workers, reaching the same services and scope gates as REST."""

from __future__ import annotations

from typing import Any

import pytest
from mcp.client import Client

from apps.runs.models import Run, RunEvent, RunStatus
from apps.substrate import tokens
from tests.conftest import wait_for, wait_status
from tests.factories.mcp import call, over_http, over_stdio, script

pytestmark = pytest.mark.usefixtures("agents", "stack")

Reply = tuple[bool, dict[str, Any]]
PARITY = {"spawn_runs", "list_runs", "compact_run", "register_hook", "list_hooks", "delete_hook", "scheduledef"}
ADMIN_ONLY = {"create_snapshot", "list_snapshots", "get_snapshot", "export_snapshot", "restore_snapshot"}
ADMIN_ONLY |= {"delete_snapshot", "operatortokendef", "pause_runtime", "resume_runtime", "get_runtime_state"}


def admin_headers(name: str) -> dict[str, str]:
    return {"authorization": "Bearer " + tokens.token_create(name=name, tenant_id="ops")["token"]}


def test_spawn_run_carries_sampling_compaction_and_parent_context_to_the_run(
    web: str, people: dict[str, dict[str, str]]
) -> None:
    options = {
        "sampling": {"temperature": 0, "seed": 7},
        "compaction": {"keep_first": True},
        "parent_context": {"root_agent_run_id": "r_root", "function_key": "fk"},
        "allowed_hosts": [],
    }

    async def work(client: Client) -> tuple[Reply, Reply, Reply]:
        spawned = await call(client, "spawn_run", {"agent": "scripted", "prompt": script({"text": "ok"}), **options})
        by_agent = await call(client, "get_run", {"agent_id": spawned[1].get("agent_id", "")})
        bad = await call(client, "spawn_run", {"agent": "scripted", "prompt": "x", "sampling": {"temperature": 3}})
        return spawned, by_agent, bad

    (error, spawned), (get_error, by_agent), (bad_error, bad) = over_http(web, people["alice"], work)
    assert not error, spawned
    run = Run.objects.get(id=spawned["run_id"])
    assert run.routing["sampling"] == {"temperature": 0, "seed": 7}  # temperature 0 kept, as over REST
    assert run.routing["compaction"]["keep_first"] is True
    assert run.parent_context == {"root_agent_run_id": "r_root", "function_key": "fk"}
    assert not get_error and by_agent["run_id"] == run.id  # loomcycle's handle: agent_id
    assert by_agent["parent_context"] == run.parent_context
    assert bad_error and bad["code"] == "invalid_body" and "temperature" in bad["error"]


def test_spawn_runs_joins_every_child_in_one_call_and_keeps_the_batch_limit(
    web: str, people: dict[str, dict[str, str]]
) -> None:
    spawns = [{"agent": "scripted", "prompt": script({"text": f"child {i}"})} for i in range(3)]
    spawns[1]["parent_context"] = {"root_agent_run_id": "r_batch"}
    text = spawns[2].pop("prompt")  # loomcycle's nested segments reach the batch as over REST
    spawns[2]["segments"] = [{"role": "user", "content": [{"type": "trusted-text", "text": text}]}]

    async def work(client: Client) -> tuple[Reply, Reply, Reply]:
        joined = await call(client, "spawn_runs", {"spawns": spawns, "timeout_ms": 60_000})
        too_many = await call(client, "spawn_runs", {"spawns": [spawns[0]] * 33})
        # alice's token names its subject, so her runs act for user "alice" (as over REST)
        listed = await call(client, "list_runs", {"user_id": "alice", "status": "completed"})
        return joined, too_many, listed

    (error, joined), (many_error, too_many), (list_error, listed) = over_http(web, people["alice"], work)
    assert not error, joined
    assert [r["final_text"] for r in joined["results"]] == ["child 0", "child 1", "child 2"]  # index-aligned
    assert [r["status"] for r in joined["results"]] == ["completed"] * 3 and joined["spawned"] == 3
    assert joined["results"][1]["parent_context"] == {"root_agent_run_id": "r_batch"}
    assert many_error and too_many["code"] == "invalid_spawns" and too_many["status"] == 400
    assert not list_error
    assert {r["run_id"] for r in joined["results"]} <= {r["run_id"] for r in listed["runs"]}
    assert {r["status"] for r in listed["runs"]} == {"completed"}

    async def other_tenant(client: Client) -> Reply:
        return await call(client, "list_runs", {"user_id": "alice"})

    error, theirs = over_http(web, people["charlie"], other_tenant)
    assert not error and theirs == {"runs": []}  # beta sees none of acme's runs


def test_compact_run_by_agent_id_compacts_a_parked_run_and_refuses_an_ended_one(
    web: str, people: dict[str, dict[str, str]]
) -> None:
    async def start(client: Client) -> tuple[Reply, Reply]:
        parked = await call(client, "spawn_run", {"agent": "compactor", "prompt": script({"text": "turn one"})})
        plain = await call(client, "spawn_run", {"agent": "scripted", "prompt": script({"text": "x"}), "wait": True})
        return parked, plain

    (_, parked), (_, plain) = over_http(web, people["alice"], start)
    wait_status(parked["run_id"], RunStatus.AWAITING_INPUT, timeout=30)

    async def compact(client: Client) -> tuple[Reply, Reply, Reply]:
        done = await call(client, "compact_run", {"agent_id": parked["agent_id"], "reason": "test"})
        refused = await call(client, "compact_run", {"run_id": plain["run_id"]})
        both = await call(client, "compact_run", {"run_id": plain["run_id"], "agent_id": plain["agent_id"]})
        return done, refused, both

    (error, done), (refused_error, refused), (both_error, both) = over_http(web, people["alice"], compact)
    assert not error and done["run_id"] == parked["run_id"] and done["queued"] is True
    # one turn is too short to compact: the woken run records that it skipped, and parks again
    handled = RunEvent.objects.filter(run_id=parked["run_id"], type__startswith="context_compaction")
    wait_for(handled.exists, timeout=30)
    assert refused_error and refused["code"] == "run_terminal" and refused["status"] == 409  # it has ended
    assert both_error and both["code"] == "invalid_body"

    async def other_tenant(client: Client) -> Reply:
        return await call(client, "compact_run", {"agent_id": parked["agent_id"]})

    error, missing = over_http(web, people["charlie"], other_tenant)
    assert error and (missing["code"], missing["status"]) == ("unknown_agent_id", 404)  # as GET /v1/agents/{id}
    Run.objects.filter(id=parked["run_id"]).update(status=RunStatus.CANCELLED)


def test_snapshot_tools_round_trip_for_an_admin_and_are_hidden_from_a_tenant(
    web: str, people: dict[str, dict[str, str]]
) -> None:
    async def work(client: Client) -> dict[str, Reply]:
        out = {"create": await call(client, "create_snapshot", {"description": "mcp parity"})}
        snap_id = out["create"][1].get("id", "")
        out["list"] = await call(client, "list_snapshots", {})
        out["get"] = await call(client, "get_snapshot", {"snapshot_id": snap_id})
        out["export"] = await call(client, "export_snapshot", {"snapshot_id": snap_id})
        out["restore"] = await call(client, "restore_snapshot", {"raw_json": out["export"][1].get("raw_json")})
        out["delete"] = await call(client, "delete_snapshot", {"snapshot_id": snap_id})
        out["gone"] = await call(client, "get_snapshot", {"snapshot_id": snap_id})
        return out

    out = over_http(web, admin_headers("mcp-snap-admin"), work)
    assert not out["create"][0], out["create"]
    snap_id = out["create"][1]["id"]
    assert out["create"][1]["label"] == "mcp parity"
    assert snap_id in [e["id"] for e in out["list"][1]["entries"]]
    assert out["get"][1]["id"] == snap_id and out["get"][1]["envelope"] == out["export"][1]["raw_json"]
    assert not out["restore"][0] and "agent_defs_restored" in out["restore"][1]
    assert out["delete"] == (False, {"deleted": snap_id})
    assert out["gone"][0] and out["gone"][1]["code"] == "snapshot_not_found"

    async def tenant(client: Client) -> tuple[set[str], Reply]:
        listed = {t.name for t in (await client.list_tools()).tools}
        return listed, await call(client, "list_snapshots", {})

    listed, (error, body) = over_http(web, people["alice"], tenant)
    assert listed.isdisjoint(ADMIN_ONLY) and PARITY <= listed
    assert error and body["code"] == "insufficient_scope"


def test_hook_tools_register_list_and_delete_within_the_callers_tenant(
    web: str, people: dict[str, dict[str, str]]
) -> None:
    hook = {"owner": "mcp", "name": "audit", "phase": "pre", "tools": ["Context"]}
    hook["callback_url"] = "https://hooks.example.com/audit"

    async def register(client: Client) -> tuple[Reply, Reply, Reply]:
        made = await call(client, "register_hook", hook)
        listed = await call(client, "list_hooks", {})
        bad = await call(client, "register_hook", {**hook, "phase": "during"})
        return made, listed, bad

    (error, made), (_, listed), (bad_error, bad) = over_http(web, people["alice"], register)
    assert not error, made
    assert [h["id"] for h in listed["hooks"] if h["name"] == "audit"] == [made["id"]]
    assert bad_error and bad["code"] == "invalid_registration"

    async def delete(client: Client) -> Reply:
        return await call(client, "delete_hook", {"id": made["id"]})

    error, theirs = over_http(web, people["charlie"], delete)
    assert error and theirs["code"] == "not_found"  # another tenant's hook
    assert over_http(web, people["alice"], delete) == (False, {"deleted": made["id"]})


def test_scheduledef_webhookdef_a2a_defs_and_operatortokendef_run_their_op_dispatch(
    web: str, people: dict[str, dict[str, str]]
) -> None:
    async def tenant(client: Client) -> tuple[Reply, Reply, Reply]:
        schedules = await call(client, "scheduledef", {"op": "get", "def_id": "def_0000000000000000"})
        webhooks = await call(client, "webhookdef", {"op": "list", "name": "no-such-hook"})
        tokens_ = await call(client, "operatortokendef", {"op": "list"})
        return schedules, webhooks, tokens_

    (s_error, schedules), (w_error, webhooks), (t_error, refused) = over_http(web, people["alice"], tenant)
    assert s_error and schedules["code"] == "not_found" and schedules["details"] == {"tool": "ScheduleDef"}
    assert not w_error and webhooks == {"name": "no-such-hook", "versions": []}

    async def a2a(client: Client) -> tuple[Reply, Reply]:
        cards = await call(client, "a2aservercarddef", {"op": "list", "name": "no-such-card"})
        peers = await call(client, "a2aagentdef", {"op": "get", "def_id": "def_0000000000000000"})
        return cards, peers

    (c_error, cards), (p_error, peers) = over_http(web, people["alice"], a2a)
    assert not c_error and cards == {"name": "no-such-card", "versions": []}
    assert p_error and peers["code"] == "not_found" and peers["details"] == {"tool": "A2AAgentDef"}
    assert t_error and refused["code"] == "insufficient_scope"

    async def admin(client: Client) -> Reply:
        return await call(client, "operatortokendef", {"op": "list", "name": "mcp-token-admin"})

    error, got = over_http(web, admin_headers("mcp-token-admin"), admin)
    assert not error and got["name"] == "mcp-token-admin", got
    assert [t["name"] for t in got["tokens"]] == ["mcp-token-admin"] and "token" not in got["tokens"][0]


def test_the_parity_tools_are_served_over_stdio(stack_env: dict[str, str], people: dict[str, dict[str, str]]) -> None:
    token = people["alice"]["authorization"].removeprefix("Bearer ")

    async def work(client: Client) -> tuple[set[str], Reply]:
        listed = {t.name for t in (await client.list_tools()).tools}
        return listed, await call(client, "list_runs", {"user_id": "nobody-here"})

    listed, (error, body) = over_stdio(["mcp", "--token", token], stack_env, work)
    assert PARITY <= listed and listed.isdisjoint(ADMIN_ONLY)
    assert not error and body == {"runs": []}


def test_evaluation_scores_a_run_of_the_callers_tenant_as_an_external_emitter(
    web: str, people: dict[str, dict[str, str]]
) -> None:
    async def work(client: Client) -> tuple[Reply, Reply, Reply, Reply]:
        spawn = {"agent": "scripted", "prompt": script({"text": "graded"}), "wait": True}
        _, run = await call(client, "spawn_run", spawn)
        submitted = await call(client, "evaluation", {"op": "submit", "run_id": run["run_id"], "score": 0.75})
        got = await call(client, "evaluation", {"op": "get", "eval_id": submitted[1].get("eval_id", "")})
        agg = await call(client, "evaluation", {"op": "aggregate", "agent": "scripted"})
        bad = await call(client, "evaluation", {"op": "submit", "run_id": run["run_id"], "score": 2})
        return submitted, got, agg, bad

    (error, submitted), (_, got), (_, agg), (bad_error, bad) = over_http(web, people["alice"], work)
    assert not error, submitted
    assert submitted["emitter_role"] == "external" and submitted["score"] == 0.75
    assert got["evaluator_agent"] == "mcp:alice" and got["evaluator_run_id"] == ""
    assert agg["count"] >= 1 and agg["by_emitter_role"]["external"]["count"] >= 1
    assert bad_error and bad["code"] == "tool_refused" and bad["details"] == {"tool": "Evaluation"}

    async def other_tenant(client: Client) -> Reply:
        return await call(client, "evaluation", {"op": "get", "eval_id": submitted["eval_id"]})

    error, missing = over_http(web, people["charlie"], other_tenant)
    assert error and "not found" in missing["error"]


def test_context_answers_the_ops_that_need_no_run(web: str, people: dict[str, dict[str, str]]) -> None:
    async def work(client: Client) -> tuple[Reply, Reply, Reply, Reply]:
        agents = await call(client, "context", {"op": "agents", "prefix": "scripted"})
        now = await call(client, "context", {"op": "time"})
        index = await call(client, "context", {"op": "help"})
        me = await call(client, "context", {"op": "self"})
        return agents, now, index, me

    (a_error, agents), (_, now), (_, index), (self_error, me) = over_http(web, people["alice"], work)
    assert not a_error and "scripted" in [a["name"] for a in agents["agents"]] and agents["can_spawn"] is False
    assert now["timezone"] == "UTC" and now["unix"] > 0
    assert index["count"] == len(index["topics"]) > 0
    assert self_error and me["code"] == "tool_refused" and "describes the calling run" in me["error"]


def test_channel_tools_declare_publish_peek_ack_and_purge_in_the_callers_tenant(
    web: str, people: dict[str, dict[str, str]]
) -> None:
    where = {"channel": "mcp-parity", "scope": "global"}

    async def work(client: Client) -> dict[str, Reply]:
        out = {"create": await call(client, "channeldef", {"op": "create", "name": "mcp-parity", "semantic": "queue"})}
        out["update"] = await call(client, "channeldef", {"op": "update", "name": "mcp-parity", "max_messages": 50})
        out["list"] = await call(client, "list_channels", {})
        out["publish"] = await call(client, "publish_channel", {**where, "payload": {"n": 1}})
        out["peek"] = await call(client, "peek_channel", where)
        out["peek_again"] = await call(client, "peek_channel", where)  # peeking commits nothing
        out["subscribe"] = await call(client, "subscribe_channel", where)  # reads and commits
        out["ack"] = await call(client, "ack_channel", {**where, "cursor": out["subscribe"][1].get("next_cursor")})
        out["regress"] = await call(client, "ack_channel", {**where, "cursor": "cur_0"})
        out["after_ack"] = await call(client, "subscribe_channel", where)
        out["user_no_id"] = await call(client, "peek_channel", {"channel": "per-user", "scope": "user"})
        out["purge"] = await call(client, "channeldef", {"op": "purge", "name": "mcp-parity"})
        out["delete"] = await call(client, "channeldef", {"op": "delete", "name": "mcp-parity"})
        return out

    out = over_http(web, people["alice"], work)
    assert not out["create"][0], out["create"]
    assert out["update"][1]["max_messages"] == 50
    assert "mcp-parity" in [c["name"] for c in out["list"][1]["channels"]]
    assert not out["publish"][0] and out["publish"][1]["channel"] == "mcp-parity"
    assert [m["value"] for m in out["peek"][1]["messages"]] == [{"n": 1}]
    assert out["peek_again"][1]["messages"] == out["peek"][1]["messages"]
    assert [m["value"] for m in out["subscribe"][1]["messages"]] == [{"n": 1}]
    assert out["ack"] == (False, {"ok": True})
    assert out["regress"][0] and out["regress"][1]["code"] == "channel_cursor_regression"
    assert out["after_ack"][1]["messages"] == []  # committed past it
    assert out["user_no_id"][0] and out["user_no_id"][1]["code"] == "invalid_body"
    assert out["purge"] == (False, {"name": "mcp-parity", "purged": 1})
    assert out["delete"] == (False, {"deleted": "mcp-parity"})

    async def yaml_channel(client: Client) -> Reply:
        return await call(client, "channeldef", {"op": "delete", "name": "handoff"})

    error, refused = over_http(web, people["alice"], yaml_channel)
    assert error and refused["code"] == "channel_yaml_immutable"
