"""Per-tenant counts and limits on what a tenant writes (issue 33, item 6), over
the REST plane in this process (the settings fixture sets the caps): definition
names per kind, ScheduleDefs and their shortest period, an agent's
max_concurrent_children, runtime channels and dynamic volumes. A count past its
cap is 429 `tenant_quota_exceeded`; a limit on a definition's content is 422
with its own code; the operator's yaml is exempt; other tenants are unaffected."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from django.test import Client

from apps.core.tools import ToolContext
from apps.substrate import services as substrate
from apps.substrate.kinds import get_kind
from apps.substrate.models import ScheduleDef
from apps.substrate.quotas import shortest_gap
from apps.substrate.selectors import agent_def_resolve
from apps.substrate.tools import AGENT_DEF_TOOL

pytestmark = pytest.mark.usefixtures("agents")

AGENT = {"provider": "mock", "model": "mock-generic"}
SCHEDULE = {"agent": "scripted", "prompt": "tick", "user_id": "u1"}


@pytest.fixture
def limits(settings: Any) -> Any:
    def set_limits(**caps: int) -> None:
        settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, **caps)

    return set_limits


def post(client: Client, headers: dict[str, str], path: str, body: dict[str, Any]) -> Any:
    return client.post(path, data=body, content_type="application/json", headers=headers)


def create(client: Client, headers: dict[str, str], kind: str, name: str, overlay: dict[str, Any]) -> Any:
    return post(client, headers, f"/v1/_{kind}def", {"op": "create", "name": name, "overlay": overlay})


def error(resp: Any, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.content
    body: dict[str, Any] = resp.json()
    assert body["code"] == code, body
    return body


def version_ids(name: str) -> list[str]:
    listed = substrate.def_list(get_kind("agent"), substrate.Author("acme", "alice"), {"name": name})
    return [row["def_id"] for row in listed["versions"]]


def test_a_tenants_definition_name_past_its_cap_is_429_and_retiring_one_frees_its_place(
    client: Client, people: dict[str, dict[str, str]], limits: Any
) -> None:
    limits(tenant_max_definitions=3)
    alice, charlie = people["alice"], people["charlie"]
    made = [create(client, alice, "agent", f"quota-{i}", AGENT) for i in range(3)]
    assert [r.status_code for r in made] == [200, 200, 200]
    refused = error(create(client, alice, "agent", "quota-3", AGENT), 429, "tenant_quota_exceeded")
    assert "LOOMCYCLE_TENANT_MAX_DEFINITIONS=3" in refused["error"] and refused["tool"] == "AgentDef"
    assert refused["details"] == {"resource": "AgentDef names", "tenant_id": "acme", "cap": 3}  # as channels'
    new_version = create(client, alice, "agent", "quota-0", {**AGENT, "system_prompt": "v2"})
    assert new_version.status_code == 200 and new_version.json()["version"] == 2  # a held name is not counted again
    assert create(client, charlie, "agent", "quota-3", AGENT).status_code == 200  # another tenant has its own count
    assert create(client, alice, "skill", "quota-skill", {"body": "b"}).status_code == 200  # and another kind
    for def_id in version_ids("quota-1"):
        retired = post(client, alice, "/v1/_agentdef", {"op": "retire", "def_id": def_id, "retired": True})
        assert retired.status_code == 200, retired.content
    assert create(client, alice, "agent", "quota-3", AGENT).status_code == 200
    [v1] = version_ids("quota-1")
    unretire = post(client, alice, "/v1/_agentdef", {"op": "retire", "def_id": v1, "retired": False})
    error(unretire, 429, "tenant_quota_exceeded")  # un-retiring takes a place again


def test_an_agents_def_tool_past_the_cap_gets_an_is_error_result(
    client: Client, people: dict[str, dict[str, str]], limits: Any
) -> None:
    limits(tenant_max_definitions=1)
    author = {**AGENT, "tools": ["AgentDef"], "agent_def_scopes": ["any"]}
    assert create(client, people["alice"], "agent", "quota-author", author).status_code == 200
    row = agent_def_resolve(tenant_id="acme", name="quota-author")
    context = ToolContext(
        run_id="r_0000000000000001",
        agent_id="a_0000000000000001",
        session_id="s_0000000000000001",
        tenant_id="acme",
        user_id="u1",
        agent_name="quota-author",
        agent_def_id=row.id,
        agent_def_sha256=row.content_sha256,
        provider="mock",
        model="mock-generic",
        step=0,
        call_id="c1",
        tools=("AgentDef",),
        cancelled=threading.Event(),
    )
    result = AGENT_DEF_TOOL.execute(context, {"op": "create", "name": "quota-child", "overlay": AGENT})
    assert result.is_error is True and "LOOMCYCLE_TENANT_MAX_DEFINITIONS=1" in result.text, result.text


def test_a_tenants_schedules_are_capped_and_may_not_fire_more_often_than_the_minimum(
    client: Client, people: dict[str, dict[str, str]], limits: Any
) -> None:
    limits(tenant_max_schedules=2, tenant_schedule_min_period_seconds=300)
    alice = people["alice"]
    every_minute = error(
        create(client, alice, "schedule", "s-fast", {**SCHEDULE, "schedule": "* * * * *"}), 422, "schedule_too_frequent"
    )
    assert "every 300 s" in every_minute["error"]
    error(
        create(client, alice, "schedule", "s-pair", {**SCHEDULE, "schedule": "0,1 * * * *"}),
        422,
        "schedule_too_frequent",
    )
    tiers = {**SCHEDULE, "user_tier_schedules": {"default": "0 * * * *", "pro": "*/2 * * * *"}}
    error(create(client, alice, "schedule", "s-tiers", tiers), 422, "schedule_too_frequent")
    assert create(client, alice, "schedule", "s-5min", {**SCHEDULE, "schedule": "*/5 * * * *"}).status_code == 200
    assert create(client, alice, "schedule", "s-hourly", {**SCHEDULE, "schedule": "@hourly"}).status_code == 200
    fork = {"op": "fork", "name": "s-hourly", "overlay": {"schedule": "*/4 * * * *"}}
    error(post(client, alice, "/v1/_scheduledef", fork), 422, "schedule_too_frequent")  # a fork is checked too
    third = create(client, alice, "schedule", "s-daily", {**SCHEDULE, "schedule": "0 3 * * *"})
    assert "LOOMCYCLE_TENANT_MAX_SCHEDULES=2" in error(third, 429, "tenant_quota_exceeded")["error"]
    # The operator's yaml is exempt from both.
    for i in range(3):
        substrate.def_sync_static(
            get_kind("schedule"), name=f"yaml-minutely-{i}", raw={**SCHEDULE, "schedule": "* * * * *"}
        )
    assert ScheduleDef.objects.filter(name__startswith="yaml-minutely-", tenant_id="").count() == 3


def test_shortest_gap_finds_the_closest_two_fires_of_a_cron() -> None:
    assert shortest_gap("* * * * *", 0) == 60
    assert shortest_gap("*/5 * * * *", 0) == 300
    assert shortest_gap("0,59 0,23 * * *", 0) == 60  # 23:59 -> 00:00 the next day
    assert shortest_gap("0 0 * * *", 0) == 86_400
    assert shortest_gap("30 12 31 * *", 0) >= 86_400 * 30


def test_an_agent_asking_for_more_children_than_the_cap_is_refused_at_write_time(
    client: Client, people: dict[str, dict[str, str]], limits: Any
) -> None:
    limits(max_concurrent_children_cap=8)
    alice = people["alice"]
    body = error(
        create(client, alice, "agent", "wide", {**AGENT, "tools": ["Agent"], "max_concurrent_children": 32}),
        422,
        "max_concurrent_children_over_cap",
    )
    assert "cap (8" in body["error"]
    assert create(client, alice, "agent", "wide", {**AGENT, "max_concurrent_children": 8}).status_code == 200
    fork = {"op": "fork", "name": "wide", "overlay": {"max_concurrent_children": 9}}
    error(post(client, alice, "/v1/_agentdef", fork), 422, "max_concurrent_children_over_cap")


def test_a_yaml_agent_asking_for_more_children_is_cut_to_the_cap(limits: Any) -> None:
    from apps.runs.children.fanout import max_concurrent_children

    limits(max_concurrent_children_cap=8)
    assert max_concurrent_children({"max_concurrent_children": 32}) == 8
    assert max_concurrent_children({"max_concurrent_children": 2}) == 2
    assert max_concurrent_children({}) == 4


def test_a_tenants_channels_and_volumes_past_their_caps_are_429(
    client: Client, people: dict[str, dict[str, str]], limits: Any
) -> None:
    limits(tenant_max_channels=2, tenant_max_volumes=2)
    alice, charlie = people["alice"], people["charlie"]
    for i in range(2):
        assert post(client, alice, "/v1/_channels", {"name": f"quota-ch-{i}"}).status_code in (200, 201)
        volume = post(client, alice, "/v1/_volumedef", {"op": "create", "name": f"quota-vol-{i}"})
        assert volume.status_code == 200, volume.content
    channel = error(post(client, alice, "/v1/_channels", {"name": "quota-ch-2"}), 429, "tenant_quota_exceeded")
    assert channel["details"] == {"resource": "channels", "tenant_id": "acme", "cap": 2}
    volume = error(
        post(client, alice, "/v1/_volumedef", {"op": "create", "name": "quota-vol-2"}), 429, "tenant_quota_exceeded"
    )
    assert volume["details"] == {"resource": "volumes", "tenant_id": "acme", "cap": 2}
    again = post(client, alice, "/v1/_volumedef", {"op": "create", "name": "quota-vol-0"})
    assert again.status_code == 200 and again.json()["deduplicated"] is True  # an existing one is not counted again
    assert post(client, charlie, "/v1/_channels", {"name": "quota-ch-2"}).status_code in (200, 201)
    assert post(client, alice, "/v1/_volumedef", {"op": "delete", "name": "quota-vol-1"}).status_code == 200
    assert post(client, alice, "/v1/_volumedef", {"op": "create", "name": "quota-vol-2"}).status_code == 200
