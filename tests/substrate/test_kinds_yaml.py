"""The admin-plane kinds (MCPServerDef, ScheduleDef, WebhookDef) through
`services.def_dispatch`, their yaml loading, `channels:` and `memory.entries:`
at boot, and `manage.py hash`."""

from __future__ import annotations

import dataclasses
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.core.errors import Invalid
from apps.memory.models import MemoryEntry
from apps.memory.seed import memory_entries_seed
from apps.substrate.config import channel_defs_sync_yaml
from apps.substrate.hashing import agent_content_sha256, mcp_content_sha256, skill_content_sha256
from apps.substrate.kinds import Refused, get_kind
from apps.substrate.models import (
    AgentDef,
    ChannelDef,
    DefSource,
    MCPServerDefActive,
    ScheduleDef,
    ScheduleDefActive,
    WebhookDefActive,
)
from apps.substrate.services import Author, def_dispatch, defs_load_yaml
from loomcycle_project.bootstrap import load_yaml_config

OPS = Author(tenant_id="", subject="ops", is_admin=True, agent_id="a_http-admin")
ACME = Author(tenant_id="acme", subject="alice")


def op(kind: str, body: dict[str, Any], author: Author = OPS) -> dict[str, Any]:
    return def_dispatch(get_kind(kind), author, body)


def refused(kind: str, body: dict[str, Any], match: str, author: Author = OPS) -> None:
    with pytest.raises(Refused, match=match):
        op(kind, body, author)


MCP = {"transport": "streamable-http", "url": "https://mcp.example.com/v1", "headers": {"X-Team": "core"}}
QUIET = {"discover": False}  # these servers are never reached (tests/mcp connects to real ones)
SCHEDULE = {"agent": "echo", "schedule": "*/15 * * * *", "prompt": "Summarise the night."}
WEBHOOK = {"agent": "echo", "auth": {"signing_secret_env": "LOOMCYCLE_GH_SECRET"}}


# --- MCPServerDef ----------------------------------------------------------------


@pytest.mark.django_db
def test_mcpserver_lifecycle_with_hash_verify_and_dedup() -> None:
    v1 = op("mcpserver", {"op": "create", "name": "tracker", "overlay": MCP, "description": "first", **QUIET})
    assert (v1["version"], v1["promoted"], v1["source"]) == (1, True, "runtime")
    assert v1["content_sha256"] == mcp_content_sha256("tracker", MCP)
    again = op("mcpserver", {"op": "create", "name": "tracker", "overlay": MCP, **QUIET})
    assert again["deduplicated"] is True and again["def_id"] == v1["def_id"]

    v2 = op("mcpserver", {"op": "fork", "name": "tracker", "overlay": {"description": "Issues"}, **QUIET})
    assert (v2["version"], v2["promoted"], v2["parent_def_id"]) == (2, False, v1["def_id"])
    assert v2["definition"]["url"] == MCP["url"] and v2["content_sha256"] != v1["content_sha256"]
    assert op("mcpserver", {"op": "promote", "def_id": v2["def_id"]})["promoted"] is True
    verified = op("mcpserver", {"op": "verify", "name": "tracker", "content_sha256": v2["content_sha256"]})
    assert (verified["matches"], verified["version"]) == (True, 2)
    assert op("mcpserver", {"op": "retire", "def_id": v1["def_id"], "retired": True})["retired"] is True
    listed = op("mcpserver", {"op": "list", "name": "tracker"})["versions"]
    assert [(v["version"], v["promoted"], v["retired"]) for v in listed] == [(2, True, False), (1, False, True)]
    assert op("mcpserver", {"op": "get", "def_id": v1["def_id"]})["definition"] == MCP


@pytest.mark.django_db
def test_mcpserver_rediscover_is_known_and_needs_a_visible_name() -> None:
    op("mcpserver", {"op": "create", "name": "tracker", "overlay": MCP, **QUIET})
    refused("mcpserver", {"op": "rediscover", "name": "elsewhere"}, "^rediscover: mcp server 'elsewhere' not found")
    refused("mcpserver", {"op": "rediscover"}, "^rediscover: missing required field: name")
    refused("mcpserver", {"op": "bogus"}, "must be one of: create, fork, get, list, promote, rediscover")


@pytest.mark.parametrize(
    ("overlay", "match"),
    [
        ({"transport": "stdio", "command": "npx"}, "'stdio' is accepted only from loomcycle.yaml"),
        ({"url": "https://x.example"}, "transport must be one of http, streamable-http \\(got None\\)"),
        ({"transport": "http"}, "missing required field: url"),
        ({"transport": "http", "url": "ftp://x.example/mcp"}, "must use http or https"),
        ({"transport": "http", "url": "https:///mcp"}, "has no host"),
        ({"transport": "http", "url": "https://x.example:99999/"}, "Port out of range"),
        ({**MCP, "headers": {"X-N": 1}}, "headers must map strings to strings"),
        ({**MCP, "command": "npx"}, "command, args and env are for stdio servers"),
        ({**MCP, "discover": True}, "unknown field\\(s\\) discover"),
        ({**MCP, "tools": "create_issue"}, "tools must be a list of strings"),
    ],
)
@pytest.mark.django_db
def test_mcpserver_refusals(overlay: dict[str, Any], match: str) -> None:
    refused("mcpserver", {"op": "create", "name": "bad", "overlay": overlay}, match)


@pytest.mark.parametrize("name", ["time__x", "_time", "time_", "team/_x", "team_/x"])
@pytest.mark.django_db
def test_mcpserver_names_that_could_fall_inside_another_servers_tool_glob_are_refused(name: str) -> None:
    refused("mcpserver", {"op": "create", "name": name, "overlay": MCP, **QUIET}, "may not contain '__'")


@pytest.mark.django_db
def test_mcpserver_non_public_ip_literals_are_refused_at_registration_unless_privately_allowlisted(
    settings: Any,
) -> None:
    for host in ("127.0.0.1", "10.1.2.3", "[::1]", "169.254.169.254"):
        overlay = {**MCP, "url": f"http://{host}/mcp"}
        refused("mcpserver", {"op": "create", "name": "ip", "overlay": overlay, **QUIET}, "non-public addresses")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_private_host_allowlist=("10.1.2.3",))
    overlay = {**MCP, "url": "http://10.1.2.3:8080/mcp"}
    assert op("mcpserver", {"op": "create", "name": "ip", "overlay": overlay, **QUIET})["version"] == 1
    public = {**MCP, "url": "https://93.184.215.14/mcp"}
    assert op("mcpserver", {"op": "create", "name": "ip-public", "overlay": public, **QUIET})["version"] == 1


@pytest.mark.django_db
def test_mcpserver_url_host_must_pass_the_allowlist(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, http_host_allowlist=("example.com.",))
    ok = op(
        "mcpserver", {"op": "create", "name": "ok", "overlay": {**MCP, "url": "https://API.example.com./mcp"}, **QUIET}
    )
    assert ok["version"] == 1
    for host in ("evilexample.com", "example.com.evil.net"):
        overlay = {**MCP, "url": f"https://{host}/mcp"}
        refused("mcpserver", {"op": "create", "name": "no", "overlay": overlay}, "not in LOOMCYCLE_HTTP_HOST_ALLOWLIST")


# --- ScheduleDef -----------------------------------------------------------------


@pytest.mark.django_db
def test_schedule_lifecycle_defaults_and_fork_promotes() -> None:
    v1 = op("schedule", {"op": "create", "name": "nightly", "overlay": SCHEDULE})
    assert v1["definition"] == {**SCHEDULE, "timezone": "UTC", "enabled": True}
    assert (v1["promoted"], v1["content_sha256"]) == (True, "")
    v2 = op("schedule", {"op": "fork", "name": "nightly", "overlay": {"timezone": "Europe/Paris", "max_fires": 3}})
    assert (v2["version"], v2["promoted"], v2["parent_def_id"]) == (2, True, v1["def_id"])
    assert v2["definition"]["timezone"] == "Europe/Paris" and v2["definition"]["schedule"] == "*/15 * * * *"
    assert ScheduleDefActive.objects.get(tenant_id="", name="nightly").active_def_id == v2["def_id"]
    assert op("schedule", {"op": "retire", "def_id": v1["def_id"], "retired": True})["retired"] is True
    assert [v["version"] for v in op("schedule", {"op": "list", "name": "nightly"})["versions"]] == [2, 1]
    assert op("schedule", {"op": "get", "def_id": v2["def_id"]})["promoted"] is True


@pytest.mark.parametrize("unknown_op", ["verify", "promote", "rediscover"])
@pytest.mark.django_db
def test_schedule_has_no_hash_ops(unknown_op: str) -> None:
    refused("schedule", {"op": unknown_op, "name": "nightly"}, "must be one of: add_hook, create, fork, get, list")


@pytest.mark.django_db
def test_schedule_hook_edits_make_new_promoted_versions() -> None:
    v1 = op("schedule", {"op": "create", "name": "hooks", "overlay": SCHEDULE})
    hook = {"kind": "channel.publish", "channel": "reports/nightly", "payload": {"done": True}}
    v2 = op("schedule", {"op": "add_hook", "def_id": v1["def_id"], "hook": hook})
    assert (v2["version"], v2["parent_def_id"], v2["promoted"]) == (2, v1["def_id"], True)
    assert v2["definition"]["on_complete"] == [hook] and v2["description"] == "add_hook: channel.publish"
    memory = {"kind": "memory.set", "scope": "agent", "key": "last_run"}
    v3 = op("schedule", {"op": "add_hook", "def_id": v2["def_id"], "hook": memory})
    assert v3["definition"]["on_complete"] == [hook, memory]
    v4 = op("schedule", {"op": "remove_hook", "def_id": v3["def_id"], "hook_index": 0})
    assert (v4["version"], v4["parent_def_id"]) == (4, v3["def_id"])
    assert v4["definition"]["on_complete"] == [memory]
    v5 = op("schedule", {"op": "remove_hook", "def_id": v4["def_id"], "hook_index": 0})
    assert "on_complete" not in v5["definition"]
    refused("schedule", {"op": "remove_hook", "def_id": v5["def_id"], "hook_index": 0}, "out of range .*0 hook")
    assert ScheduleDef.objects.get(id=v3["def_id"]).definition["on_complete"] == [hook, memory]  # rows immutable


MCP_HOOK = {"kind": "mcp.call", "server": "s", "tool": "t"}


@pytest.mark.parametrize(
    ("body", "match"),
    [
        ({"op": "add_hook", "hook": {"kind": "mcp.call"}}, "add_hook: missing required field: def_id"),
        ({"op": "add_hook", "def_id": "def_nope", "hook": MCP_HOOK}, "^add_hook: def_id 'def_nope' not found"),
        ({"op": "add_hook", "def_id": "x", "hook": {"kind": "http.post"}}, "hook kind must be one of channel.publish"),
        ({"op": "add_hook", "def_id": "x", "hook": {"kind": "mcp.call", "server": "s"}}, "field: tool"),
        (
            {"op": "add_hook", "def_id": "x", "hook": {"kind": "memory.set", "scope": "run", "key": "k"}},
            "scope must be",
        ),
        ({"op": "add_hook", "def_id": "x", "hook": {**MCP_HOOK, "x": 1}}, "unknown field\\(s\\) x"),
        ({"op": "remove_hook", "def_id": "x"}, "missing required field: hook_index"),
    ],
)
@pytest.mark.django_db
def test_schedule_hook_edit_refusals(body: dict[str, Any], match: str) -> None:
    refused("schedule", body, match)


@pytest.mark.parametrize(
    ("overlay", "match"),
    [
        ({"schedule": "* * * * *"}, "missing required field: agent"),
        ({"agent": "echo"}, "missing required field: schedule \\(a 5-field cron\\) or user_tier_schedules"),
        ({**SCHEDULE, "user_tier_schedules": {"default": "* * * * *"}}, "mutually exclusive"),
        ({**SCHEDULE, "schedule": "*/15 * * *"}, "want 5 fields"),
        ({**SCHEDULE, "schedule": "61 * * * *"}, "invalid minute field '61'"),
        ({**SCHEDULE, "schedule": "0 9 * * funday"}, "invalid day of week field 'funday'"),
        ({**SCHEDULE, "schedule": "0 0 31 2 *"}, "never occurs"),
        ({"agent": "echo", "user_tier_schedules": {"pro": "bad"}}, "user_tier_schedules.pro 'bad': want 5 fields"),
        ({"agent": "echo", "user_tier_schedules": {"pro": "0 * * * *"}}, "no entry for user tier 'default'"),
        ({**SCHEDULE, "timezone": "Mars/Olympus_Mons"}, "not a known IANA time zone"),
        ({**SCHEDULE, "catch_up_max": -1}, "catch_up_max must be a non-negative integer"),
        ({**SCHEDULE, "max_fires": "3"}, "max_fires must be a non-negative integer"),
        ({**SCHEDULE, "enabled": "yes"}, "enabled must be true or false"),
        ({**SCHEDULE, "prompt": [{"role": "tool", "content": []}]}, "role must be user or system"),
        (
            {**SCHEDULE, "prompt": [{"role": "user", "content": [{"type": "image"}]}]},
            "type: trusted-text\\|untrusted-block\\|text, text",
        ),
        ({**SCHEDULE, "metadata": ["x"]}, "metadata must be an object"),
        ({**SCHEDULE, "on_complete": {"kind": "mcp.call"}}, "on_complete must be a list"),
        ({**SCHEDULE, "user_credentials": {"gh": "secret"}}, "use user_credentials_from_env"),
        ({**SCHEDULE, "required_credentials": ["gh"]}, "required credential 'gh' is missing"),
        ({**SCHEDULE, "user_credentials_from_env": {"gh": "not-an-env"}}, "not an environment variable name"),
        ({**SCHEDULE, "cron": "x"}, "unknown field\\(s\\) cron"),
    ],
)
@pytest.mark.django_db
def test_schedule_refusals(overlay: dict[str, Any], match: str) -> None:
    refused("schedule", {"op": "create", "name": "bad", "overlay": overlay}, match)


@pytest.mark.django_db
def test_schedule_accepts_descriptors_tiers_and_structured_prompts() -> None:
    prompt = [{"role": "user", "content": [{"type": "text", "text": "go"}]}]
    tiers = {"default": "@daily", "pro": "0 */2 ? * mon-fri"}
    out = op(
        "schedule",
        {
            "op": "create",
            "name": "tiers",
            "overlay": {"agent": "echo", "user_tier_schedules": tiers, "user_tier": "pro", "prompt": prompt},
        },
    )
    assert out["definition"]["user_tier_schedules"] == tiers and out["definition"]["prompt"] == prompt


# --- WebhookDef ------------------------------------------------------------------


@pytest.mark.django_db
def test_webhook_create_fills_defaults_and_fork_promotes() -> None:
    v1 = op("webhook", {"op": "create", "name": "github", "overlay": WEBHOOK})
    assert v1["definition"] == {
        "enabled": True,
        "delivery": "spawn",
        "agent": "echo",
        "auth": {"kind": "hmac", "algorithm": "sha256", "signing_secret_env": "LOOMCYCLE_GH_SECRET"},
        "rate_limit": {"requests_per_minute": 60, "burst": 10},
        "body_size_limit_bytes": 1048576,
    }
    mapping = {"goal": "$.issue.title", "user_id": "$.sender.login", "run_metadata.n": "$.items[0].n"}
    overlay = {"payload_mapping": mapping, "sync_response": {"enabled": True}}
    v2 = op("webhook", {"op": "fork", "name": "github", "overlay": overlay})
    assert (v2["version"], v2["promoted"]) == (2, True)
    assert v2["definition"]["sync_response"] == {"enabled": True, "timeout_ms": 30000}
    assert v2["definition"]["payload_mapping"] == mapping
    channel = {"delivery": "channel", "channel": "inbox/github", "auth": {"kind": "bearer", "bearer_token_env": "T"}}
    v3 = op("webhook", {"op": "create", "name": "to-channel", "overlay": channel})
    assert v3["definition"]["auth"] == {"kind": "bearer", "bearer_token_env": "T"} and "agent" not in v3["definition"]
    refused("webhook", {"op": "verify", "name": "github"}, "unknown op 'verify'")


@pytest.mark.parametrize(
    ("name", "overlay", "match"),
    [
        ("w", {"auth": {"kind": "none"}}, "webhook 'w' \\(delivery spawn\\): missing required field: agent"),
        ("w", {"delivery": "channel", "auth": {"kind": "none"}}, "missing required field: channel"),
        ("w", {**WEBHOOK, "delivery": "email"}, "delivery must be spawn or channel"),
        ("w", {"agent": "echo"}, "auth \\(hmac\\): missing required field: signing_secret_env"),
        ("w", {"agent": "echo", "auth": {"kind": "bearer"}}, "missing required field: bearer_token_env"),
        ("w", {"agent": "echo", "auth": {"kind": "basic"}}, "auth.kind must be hmac, bearer or none"),
        ("w", {**WEBHOOK, "auth": {**WEBHOOK["auth"], "algorithm": "sha1"}}, "auth.algorithm must be sha256"),
        ("w", {**WEBHOOK, "auth": {**WEBHOOK["auth"], "secret": "x"}}, "unknown field\\(s\\) secret"),
        ("w", {**WEBHOOK, "rate_limit": {"requests_per_minute": 0}}, "requests_per_minute must be a positive integer"),
        ("w", {**WEBHOOK, "rate_limit": {"rpm": 5}}, "rate_limit takes requests_per_minute and burst"),
        ("w", {**WEBHOOK, "body_size_limit_bytes": 0}, "body_size_limit_bytes must be a positive integer"),
        ("w", {**WEBHOOK, "payload_mapping": {"goal": "$..title"}}, "not a supported path"),
        ("w", {**WEBHOOK, "payload_mapping": {"goal": "$.items[*]"}}, "not a supported path"),
        ("w", {**WEBHOOK, "payload_mapping": {"goal": "issue.title"}}, "not a supported path"),
        ("w", {**WEBHOOK, "payload_mapping": {"prompt": "$.a"}}, "target 'prompt' must be goal, user_id"),
        ("w", {**WEBHOOK, "sync_response": {"timeout_ms": -5}}, "timeout_ms must be a positive integer"),
        ("w", {**WEBHOOK, "on_complete": [{"kind": "channel.publish"}]}, "missing required field: channel"),
        ("a/b", WEBHOOK, "a webhook name is one segment"),
    ],
)
@pytest.mark.django_db
def test_webhook_refusals(name: str, overlay: dict[str, Any], match: str) -> None:
    refused("webhook", {"op": "create", "name": name, "overlay": overlay}, match)


@pytest.mark.django_db
def test_admin_kinds_are_tenant_scoped(settings: Any) -> None:
    import dataclasses

    given = {"acme": ("LOOMCYCLE_GH_SECRET",)}  # acme's own rows sign only with what it is given
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, tenant_credential_env=given)
    mine = op("webhook", {"op": "create", "name": "github", "overlay": WEBHOOK}, ACME)
    assert mine["tenant_id"] == "acme"
    other = Author(tenant_id="beta", subject="charlie")
    refused("webhook", {"op": "get", "def_id": mine["def_id"]}, "not found", other)
    assert op("webhook", {"op": "list", "name": "github"}, other)["versions"] == []
    assert WebhookDefActive.objects.get(tenant_id="acme", name="github").active_def_id == mine["def_id"]


# --- yaml --------------------------------------------------------------------------

YAML: dict[str, Any] = {
    "mcp_servers": {
        "local-fs": {"transport": "stdio", "command": "npx", "args": ["-y", "fs-mcp"], "env": {"ROOT": "/tmp"}},
        "tracker": dict(MCP),
    },
    "scheduled_runs": {"nightly": {**SCHEDULE, "enabled": False, "future_knob": 1}},
    "webhooks": {"github": dict(WEBHOOK)},
}


def active_ids(kind_pointer: Any) -> dict[str, str]:
    return {p.name: p.active_def_id for p in kind_pointer.objects.filter(tenant_id="")}


@pytest.mark.django_db
def test_yaml_admin_kinds_load_idempotently_and_version_changes() -> None:
    first = defs_load_yaml(config=YAML)
    assert sorted(r.name for r in first["mcpserver"]) == ["local-fs", "tracker"]
    assert first["mcpserver"][0].definition["transport"] == "stdio"  # stdio is fine from yaml
    assert all(r.source == DefSource.YAML for k in ("mcpserver", "schedule", "webhook") for r in first[k])
    assert "future_knob" not in first["schedule"][0].definition  # yaml drops unknown fields
    second = defs_load_yaml(config=YAML)
    for key in ("mcpserver", "schedule", "webhook"):
        assert [r.id for r in second[key]] == [r.id for r in first[key]]

    changed = {**YAML, "scheduled_runs": {"nightly": {**SCHEDULE, "schedule": "0 3 * * *"}}}
    v2 = defs_load_yaml(config=changed)["schedule"][0]
    assert (v2.version, v2.parent_id) == (2, first["schedule"][0].id)
    assert active_ids(ScheduleDefActive)["nightly"] == v2.id

    defs_load_yaml(config={**YAML, "mcp_servers": {"tracker": dict(MCP)}, "webhooks": {}})
    gone = MCPServerDefActive.objects.get(tenant_id="", name="local-fs")
    assert (gone.static_def_id, gone.active_def_id) == (None, None)
    assert WebhookDefActive.objects.get(tenant_id="", name="github").static_def_id is None
    refused("mcpserver", {"op": "create", "name": "tracker", "overlay": MCP}, "matches a static yaml entry")


@pytest.mark.parametrize(
    ("block", "match"),
    [
        ({"scheduled_runs": {"x": {"agent": "echo", "schedule": "nope"}}}, "want 5 fields"),
        ({"webhooks": {"x": {"delivery": "channel"}}}, "missing required field: channel"),
        ({"mcp_servers": {"x": {"transport": "stdio"}}}, "missing required field: command"),
        ({"mcp_servers": {"time__x": {"transport": "stdio", "command": "t"}}}, "may not contain '__'"),
    ],
)
@pytest.mark.django_db
def test_invalid_yaml_admin_entries_are_config_invalid(block: dict[str, Any], match: str) -> None:
    with pytest.raises(Invalid, match=match) as exc:
        defs_load_yaml(config=block)
    assert exc.value.code == "config_invalid"


CHANNELS: dict[str, Any] = {
    "channels": {
        "tasks/new": {"scope": "user", "semantic": "queue", "default_ttl": 3600, "max_messages": 100},
        "news": {"semantic": "broadcast", "description": "Announcements"},
        "_system/heartbeat-30s": {"publisher": "system", "period": "30s", "default_ttl": 0},
    }
}


@pytest.mark.django_db
def test_yaml_channels_are_upserted_idempotently_and_removed_yaml_ones_deleted() -> None:
    ChannelDef.objects.create(tenant_id="", name="runtime-made", source=DefSource.RUNTIME)
    first = channel_defs_sync_yaml(config=CHANNELS)
    assert sorted(first.created) == ["_system/heartbeat-30s", "news", "tasks/new"]
    row = ChannelDef.objects.get(tenant_id="", name="tasks/new")
    assert (row.scope, row.semantic, row.default_ttl_seconds, row.max_messages, row.source) == (
        "user",
        "queue",
        3600,
        100,
        "yaml",
    )
    news = ChannelDef.objects.get(name="news")
    assert (news.scope, news.default_ttl_seconds, news.description) == ("global", None, "Announcements")
    stamp = news.updated_at
    again = channel_defs_sync_yaml(config=CHANNELS)
    assert (again.created, again.updated, again.deleted) == ([], [], [])
    assert ChannelDef.objects.get(name="news").updated_at == stamp

    edited = {"channels": {"tasks/new": {"scope": "agent"}, "runtime-made": {"semantic": "topic"}}}
    third = channel_defs_sync_yaml(config=edited)
    assert sorted(third.updated) == ["runtime-made", "tasks/new"]
    assert third.deleted == ["_system/heartbeat-30s", "news"]
    assert ChannelDef.objects.get(name="runtime-made").source == DefSource.YAML  # yaml took it over
    assert sorted(ChannelDef.objects.values_list("name", flat=True)) == ["runtime-made", "tasks/new"]


@pytest.mark.django_db
def test_runtime_channels_survive_a_yaml_sync() -> None:
    ChannelDef.objects.create(tenant_id="", name="scratch", source=DefSource.RUNTIME)
    ChannelDef.objects.create(tenant_id="acme", name="news", source=DefSource.YAML)  # another tenant's row
    assert channel_defs_sync_yaml(config={}).deleted == []
    assert ChannelDef.objects.count() == 2


@pytest.mark.parametrize(
    ("channels", "match"),
    [
        ({"x": {"scope": "run"}}, "scope must be agent, user, global or tenant"),
        ({"x": {"semantic": "stream"}}, "semantic must be queue, broadcast or topic"),
        ({"x": {"default_ttl": "1h"}}, "default_ttl must be a non-negative integer"),
        ({"x": {"max_messages": -1}}, "max_messages must be a non-negative integer"),
        ({"_system/alarms": {}}, "reserved for `publisher: system`"),
        ({"a//b": {}}, "each '/'-separated segment"),
        ({"x": ["queue"]}, "must be a mapping"),
    ],
)
@pytest.mark.django_db
def test_invalid_channels_are_config_invalid(channels: dict[str, Any], match: str) -> None:
    with pytest.raises(Invalid, match=match) as exc:
        channel_defs_sync_yaml(config={"channels": channels})
    assert exc.value.code == "config_invalid"
    assert not ChannelDef.objects.exists()


SEEDS: dict[str, Any] = {
    "memory": {
        "embedder": {"provider": "hashing"},  # other `memory:` keys are not this loader's business
        "entries": [
            {"scope": "agent", "scope_id": "researcher", "key": "style", "value": {"tone": "terse"}},
            {"scope": "global", "key": "motd", "value": "hello"},
            {"scope": "user", "scope_id": "u1", "key": "visits", "value": 0, "tenant_id": "acme"},
        ],
    }
}


@pytest.mark.django_db
def test_memory_seeds_insert_once_and_never_overwrite() -> None:
    first = memory_entries_seed(config=SEEDS)
    assert (first.inserted, first.existing) == (3, 0)
    visits = MemoryEntry.objects.get(tenant_id="acme", scope="user", scope_id="u1", key="visits")
    assert (visits.value, visits.expires_at, visits.embedding) == (0, None, None)
    MemoryEntry.objects.filter(pk=visits.pk).update(value=7)  # a run has counted since
    second = memory_entries_seed(config=SEEDS)
    assert (second.inserted, second.existing) == (0, 3)
    assert MemoryEntry.objects.get(pk=visits.pk).value == 7
    assert MemoryEntry.objects.count() == 3
    MemoryEntry.objects.filter(key="motd").delete()  # deleting a key re-seeds it at the next boot
    assert memory_entries_seed(config=SEEDS).inserted == 1


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"scope": "run", "scope_id": "r", "key": "k", "value": 1}, "scope must be one of agent, user, tenant, global"),
        ({"scope": "agent", "key": "k", "value": 1}, "scope agent needs a scope_id"),
        ({"scope": "tenant", "scope_id": "x", "key": "k", "value": 1}, "scope tenant takes no scope_id"),
        ({"scope": "global", "key": "", "value": 1}, "key must be a non-empty string"),
        ({"scope": "global", "key": "k"}, "value is required"),
        ({"scope": "global", "key": "k", "value": "x" * 70000}, "over the 65536-byte limit"),
        ({"scope": "global", "key": "k", "value": 1, "tenant_id": "a b"}, "tenant_id match"),
        ("k=v", "must be a mapping"),
    ],
)
@pytest.mark.django_db
def test_invalid_memory_seeds_are_config_invalid(entry: Any, match: str) -> None:
    with pytest.raises(Invalid, match=match) as exc:
        memory_entries_seed(config={"memory": {"entries": [entry]}})
    assert exc.value.code == "config_invalid"


@pytest.mark.django_db
def test_duplicate_memory_seeds_are_refused() -> None:
    entry = {"scope": "global", "key": "k", "value": 1}
    with pytest.raises(Invalid, match="duplicate seed"):
        memory_entries_seed(config={"memory": {"entries": [entry, dict(entry, value=2)]}})


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.django_db
def test_boot_loads_every_block_and_an_invalid_block_loads_nothing(settings: Any, tmp_path: Path) -> None:
    good = write(
        tmp_path,
        "good.yaml",
        "agents:\n  boot-a: {provider: mock, model: mock-generic}\n"
        "skills:\n  boot-s: {body: Be brief.}\n"
        "channels:\n  boot/ch: {scope: agent}\n"
        "memory:\n  entries:\n    - {scope: global, key: boot-k, value: [1, 2]}\n",
    )
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(good),))
    assert [a.name for a in load_yaml_config()] == ["boot-a"]
    assert ChannelDef.objects.filter(name="boot/ch").exists()
    assert MemoryEntry.objects.get(key="boot-k").value == [1, 2]

    bad = write(tmp_path, "bad.yaml", "agents:\n  boot-b: {provider: mock, model: m}\nchannels:\n  x: {scope: run}\n")
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(good), str(bad)))
    with pytest.raises(Invalid, match="scope must be"):
        load_yaml_config()
    assert not AgentDef.objects.filter(name="boot-b").exists()


@pytest.mark.django_db
def test_bundled_and_test_yaml_load() -> None:
    agents = load_yaml_config()
    assert {"echo", "toolcaller", "chat"} <= {a.name for a in agents}
    assert ChannelDef.objects.filter(tenant_id="", source=DefSource.YAML).exists()
    assert MemoryEntry.objects.exists()


# --- manage.py hash ----------------------------------------------------------------


def run_hash(*args: str) -> str:
    out = StringIO()
    call_command("hash", *args, stdout=out)
    return out.getvalue().strip()


AGENT_RAW = {"provider": "mock", "model": "mock-generic", "system_prompt": "Be terse.", "tools": ["Context"]}


def test_hash_of_an_agent_yaml_and_md_file(tmp_path: Path) -> None:
    expected = agent_content_sha256("writer", AGENT_RAW)
    single = write(
        tmp_path, "writer.yaml", "provider: mock\nmodel: mock-generic\nsystem_prompt: Be terse.\ntools: [Context]\n"
    )
    assert run_hash("agent", str(single)) == expected
    named = write(
        tmp_path,
        "any.yml",
        "name: writer\nprovider: mock\nmodel: mock-generic\nsystem_prompt: Be terse.\ntools: Context\n",
    )
    assert run_hash("agent", str(named)) == expected
    md = tmp_path / "writer.md"
    front = b"---\r\nname: writer\r\nprovider: mock\r\nmodel: mock-generic\r\ntools: Context\r\nskills: [pdf]\r\n"
    md.write_bytes(front + b"---\r\nBe terse.\r\n\r\n")
    assert run_hash("agent", str(md)) == expected
    block = write(
        tmp_path,
        "lc.yaml",
        "agents:\n  writer: {provider: mock, model: mock-generic, system_prompt: Be terse., tools: [Context]}\n"
        "  other: {provider: mock, model: m}\n",
    )
    lines = run_hash("agent", str(block)).splitlines()
    assert lines == [f"writer {expected}", f"other {agent_content_sha256('other', {'provider': 'mock', 'model': 'm'})}"]
    assert run_hash("skill", str(write(tmp_path, "s.yaml", "body: Be brief.\n"))) == skill_content_sha256(
        "s", {"body": "Be brief."}
    )


def test_hash_of_a_skill_md_and_an_mcp_yaml(tmp_path: Path) -> None:
    skill = write(
        tmp_path, "summariser/SKILL.md", "---\ndescription: Shorten\nallowed-tools: Read, Grep\n---\nSummarise.\n"
    )
    expected = skill_content_sha256(
        "summariser", {"description": "Shorten", "tools": ["Read", "Grep"], "body": "Summarise."}
    )
    assert run_hash("skill", str(skill)) == expected
    mcp = write(
        tmp_path,
        "tracker.yaml",
        "transport: streamable-http\nurl: https://mcp.example.com/v1\nheaders: {X-Team: core}\n",
    )
    assert run_hash("mcpserver", str(mcp)) == mcp_content_sha256("tracker", MCP)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("agent", "missing.yaml"), "file not found: missing.yaml"),
        (("mcpserver", "{md}"), "describes an agent or a skill, not a mcpserver"),
        (("agent", "{mismatch}"), "frontmatter name 'other' != file name 'x'"),
        (("agent", "{invalid}"), "a pin needs both provider and model"),
    ],
)
def test_hash_refusals(tmp_path: Path, args: tuple[str, str], match: str) -> None:
    files = {
        "{md}": write(tmp_path, "m.md", "body"),
        "{mismatch}": write(tmp_path, "x.md", "---\nname: other\n---\nbody\n"),
        "{invalid}": write(tmp_path, "i.yaml", "model: m\n"),
    }
    target = str(files.get(args[1], args[1]))
    with pytest.raises(CommandError, match=match):
        run_hash(args[0], target)


@pytest.mark.django_db
def test_hash_of_a_loaded_definition_by_name() -> None:
    defs_load_yaml(config={"agents": {"hashme": dict(AGENT_RAW)}, "mcp_servers": {"tracker": dict(MCP)}})
    assert run_hash("agent", "hashme") == agent_content_sha256("hashme", AGENT_RAW)
    assert run_hash("agent", "hashme") == AgentDef.objects.get(name="hashme").content_sha256
    assert run_hash("mcpserver", "tracker") == mcp_content_sha256("tracker", MCP)
    with pytest.raises(CommandError, match="no yaml agent named 'nobody' is loaded"):
        run_hash("agent", "nobody")
