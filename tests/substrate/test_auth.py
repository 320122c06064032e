"""Bearer resolution (token -> legacy -> open mode), the SPEC 2.1 scope gate on
every route and on the WebSocket, and `GET /v1/_me`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.db import connection
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect
from websockets.typing import Subprotocol

from apps.core.errors import Forbidden, Unauthorized
from apps.core.redis import sync_client
from apps.core.types import Principal
from apps.substrate import auth_cache, tokens
from apps.substrate.auth import (
    AuthUnavailable,
    authenticate,
    authorize,
    has_scope,
    required_scope,
)
from tests.conftest import wait_status

LEGACY = "legacy-env-token"


@pytest.fixture
def lc(settings: Any, tmp_path: Path) -> Any:
    """No legacy token, and an audit log of this test's own (the pepper stays as
    configured: the session Daphne hashes with it too)."""
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, auth_token=None, audit_log_path=str(tmp_path / "audit.jsonl")
    )
    return settings


def with_legacy(settings: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, auth_token=LEGACY)


def mint(name: str, scopes: list[str] | None = None, tenant: str = "acme") -> str:
    token: str = tokens.token_create(name=name, tenant_id=tenant, scopes=scopes)["token"]
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def principal(*scopes: str) -> Principal:
    return Principal(tenant_id="acme", subject="s", scopes=frozenset(scopes))


# --- the route table and scope implication (SPEC 2.1) ----------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "scope"),
    [
        ("GET", "/v1/_me", ""),
        ("POST", "/v1/chat/completions", ""),
        ("POST", "/v1/_users", "substrate:tenant"),
        ("GET", "/v1/_users", ""),
        ("GET", "/v1/_history", "runs:read"),
        ("GET", "/v1/client-tools", "runs:create"),
        ("POST", "/v1/_agentdef", "substrate:tenant"),
        ("GET", "/v1/_skilldef/names", "substrate:tenant"),
        ("POST", "/v1/_credentialdef", "substrate:tenant"),
        ("GET", "/v1/_document/asset/c1", "substrate:tenant"),
        ("GET", "/v1/_memory/scopes", "substrate:tenant"),
        ("POST", "/v1/_memory/repair-tenant", "substrate:admin"),
        ("GET", "/v1/_channels/x", "substrate:tenant"),
        ("POST", "/v1/_operatortokendef", "substrate:admin"),
        ("GET", "/v1/_operatortokendef/names", "substrate:admin"),
        ("POST", "/v1/_pause", "substrate:admin"),
        ("GET", "/v1/_state", "substrate:admin"),
        ("GET", "/v1/_tenants", "substrate:admin"),
        ("POST", "/v1/hooks", "substrate:tenant"),
        ("GET", "/metrics", "substrate:admin"),
        ("GET", "/v1/users/u1/channels/inbox", "channel:read"),
        ("POST", "/v1/users/u1/channels/inbox/publish", "channel:publish"),
        ("POST", "/v1/runs", "runs:create"),
        ("POST", "/v1/runs:batch", "runs:create"),
        ("POST", "/v1/sessions/s_1/messages", "runs:create"),
        ("POST", "/v1/sessions/s_1/replay", "runs:create"),
        ("POST", "/v1/agents/a_1/cancel", "runs:create"),
        ("POST", "/v1/runs/r_1/input", "runs:create"),
        ("POST", "/v1/runs/r_1/cancel", "runs:create"),
        ("POST", "/v1/runs/r_1/fork", "runs:create"),
        ("POST", "/v1/runs/r_1/interrupts/i_1/resolve", "runs:create"),
        ("GET", "/v1/runs", "runs:read"),
        ("GET", "/v1/runs/r_1", "runs:read"),
        ("GET", "/v1/runs/r_1/stream", "runs:read"),
        ("GET", "/v1/agents/a_1", "runs:read"),
        ("GET", "/v1/users/u1/agents", "runs:read"),
        ("GET", "/ws/runs/r_1/", "runs:read"),
        ("DELETE", "/v1/something", "substrate:admin"),
        ("POST", "/v1/runs/r_1/unknown", "substrate:admin"),
        ("GET", "/v1/config", ""),
    ],
)
def test_required_scope_follows_the_spec_table(method: str, path: str, scope: str) -> None:
    assert required_scope(method, path) == scope


def test_scope_implication() -> None:
    admin, tenant, user = frozenset({"substrate:admin"}), frozenset({"substrate:tenant"}), frozenset({"substrate:user"})
    assert all(has_scope(admin, s) for s in tokens.SCOPE_CATALOG)
    assert {s for s in tokens.SCOPE_CATALOG if has_scope(tenant, s)} == tokens.SCOPE_CATALOG - {
        "substrate:admin",
        "substrate:user",
        "runs:act-as-user",  # only ever granted explicitly (apps.core.identity)
    }
    assert {s for s in tokens.SCOPE_CATALOG if has_scope(user, s)} == {"substrate:user", "runs:create", "runs:read"}
    assert has_scope(frozenset({"runs:read"}), "") and not has_scope(frozenset({"runs:read"}), "runs:create")


def test_tenant_members_may_read_the_tenant_plane_but_not_write_it() -> None:
    member, isolated = principal("runs:read", "channel:read"), principal("substrate:user")
    authorize(member, "GET", "/v1/_agentdef/names")
    with pytest.raises(Forbidden):
        authorize(member, "POST", "/v1/_agentdef")
    for path in ("/v1/_erasure", "/v1/hooks", "/v1/_memory/changes", "/v1/_document/changes"):
        with pytest.raises(Forbidden):
            authorize(member, "GET", path)
    with pytest.raises(Forbidden):
        authorize(isolated, "GET", "/v1/_agentdef/names")
    with pytest.raises(Forbidden):
        authorize(principal("providers:operator-key"), "GET", "/v1/_agentdef/names")


def test_a_403_names_the_required_scope() -> None:
    with pytest.raises(Forbidden) as info:
        authorize(principal("runs:read"), "POST", "/v1/_operatortokendef")
    assert info.value.code == "insufficient_scope" and info.value.message == "insufficient scope"
    assert info.value.headers == {"WWW-Authenticate": 'Bearer scope="substrate:admin"'}


# --- resolution order ------------------------------------------------------------------------


@pytest.mark.django_db
def test_legacy_env_token_works_until_the_first_admin_token_exists(lc: Any) -> None:
    with_legacy(lc)
    legacy = authenticate(LEGACY, "192.0.2.10")
    assert (legacy.tenant_id, legacy.subject, legacy.legacy, legacy.is_admin) == ("", "legacy-token", True, True)
    with pytest.raises(Unauthorized):
        authenticate("wrong", "127.0.0.1")
    with pytest.raises(Unauthorized):
        authenticate(None, "127.0.0.1")
    mint("reader", ["runs:read"])
    assert authenticate(LEGACY, "192.0.2.10").legacy  # a narrow token does not retire it
    admin = mint("ops")
    with pytest.raises(Unauthorized):
        authenticate(LEGACY, "127.0.0.1")
    assert authenticate(admin, "192.0.2.10").subject == "tok-ops"


@pytest.mark.django_db
def test_open_mode_serves_loopback_only_and_ends_with_the_first_token_of_any_scope(lc: Any) -> None:
    opened = authenticate(None, "127.0.0.1")
    assert opened.open_mode and opened.is_admin
    assert authenticate(None, "::1").open_mode
    with pytest.raises(Unauthorized):
        authenticate("lct_not-a-token", "127.0.0.1")  # a presented bearer that is no token: never the admin
    with pytest.raises(Forbidden) as info:
        authenticate(None, "192.0.2.10")  # documentation address: never contacted
    assert info.value.code == "open_mode_loopback"
    reader = mint("reader", ["runs:read"])
    with pytest.raises(Unauthorized):
        authenticate(None, "127.0.0.1")  # a tenant's narrow token closes it (a same-host proxy is loopback)
    assert authenticate(reader, "127.0.0.1").scopes == frozenset({"runs:read"})


@pytest.mark.django_db
def test_a_token_store_error_fails_closed_never_open(lc: Any) -> None:
    with connection.cursor() as cur:  # rolled back with the test transaction
        cur.execute("ALTER TABLE substrate_operatortokendef RENAME TO substrate_operatortokendef_gone")
    with pytest.raises(AuthUnavailable) as info:
        authenticate(None, "127.0.0.1")
    assert info.value.status == 503


# --- over HTTP (Django test client; committed rows, as the auth thread has its own connection) ---


@pytest.mark.django_db(transaction=True)
def test_a_runs_read_token_gets_403_with_the_required_scope_on_admin_and_tenant_routes(lc: Any, client: Client) -> None:
    reader = mint("reader", ["runs:read"])
    for path, scope in (("/v1/_agentdef", "substrate:tenant"), ("/v1/_operatortokendef", "substrate:admin")):
        resp = client.post(path, data={"op": "list"}, content_type="application/json", headers=bearer(reader))
        assert resp.status_code == 403, resp.content
        assert resp.json()["code"] == "insufficient_scope" and resp.json()["error"] == "insufficient scope"
        assert resp["WWW-Authenticate"] == f'Bearer scope="{scope}"'


@pytest.mark.django_db(transaction=True)
def test_unknown_and_retired_tokens_get_an_opaque_json_401(lc: Any, client: Client) -> None:
    mint("ops")
    retired = mint("old", ["runs:read"])
    tokens.token_retire(name="old")
    for headers in ({}, bearer("lct_unknown"), bearer(retired)):
        resp = client.get("/v1/_me", headers=headers)
        assert resp.status_code == 401 and resp.json()["code"] == "unauthorized"
        assert resp["WWW-Authenticate"] == "Bearer"


@pytest.mark.django_db(transaction=True)
def test_a_tenant_token_may_author_defs_and_a_runs_create_token_may_not(lc: Any, client: Client) -> None:
    tenant, creator = mint("tenant-op", ["substrate:tenant"]), mint("creator", ["runs:create"])
    body = {"op": "list", "name": "anything"}
    ok = client.post("/v1/_agentdef", data=body, content_type="application/json", headers=bearer(tenant))
    assert ok.status_code == 200, ok.content
    denied = client.post("/v1/_agentdef", data=body, content_type="application/json", headers=bearer(creator))
    assert denied.status_code == 403
    minting = client.post("/v1/_operatortokendef", data=body, content_type="application/json", headers=bearer(tenant))
    assert minting.status_code == 403 and minting["WWW-Authenticate"] == 'Bearer scope="substrate:admin"'


def me(client: Client, **headers: str) -> dict[str, Any]:
    resp = client.get("/v1/_me", headers=headers)
    assert resp.status_code == 200, resp.content
    out: dict[str, Any] = resp.json()
    return out


@pytest.mark.django_db(transaction=True)
def test_me_for_each_principal_kind(lc: Any, client: Client) -> None:
    caps = {"mcp_allow_dynamic_stdio": False, "http_host_allowlist_configured": False}
    opened = me(client)
    assert opened["open_mode"] is True and opened["is_admin"] is True and opened["capabilities"] == caps
    with_legacy(lc)
    assert me(client, Authorization=f"Bearer {LEGACY}") == {
        "tenant_id": "",
        "subject": "legacy-token",
        "scopes": ["substrate:admin"],
        "is_admin": True,
        "legacy": True,
        "capabilities": caps,
    }
    lc.LOOMCYCLE = dataclasses.replace(lc.LOOMCYCLE, http_host_allowlist=("api.example.com",))
    reader = tokens.token_create(name="reader", tenant_id="acme", subject="alice", scopes=["runs:read", "channel:read"])
    assert me(client, Authorization=f"Bearer {reader['token']}") == {
        "tenant_id": "acme",
        "subject": "alice",
        "scopes": ["channel:read", "runs:read"],
        "is_admin": False,
        "legacy": False,
        "capabilities": {**caps, "http_host_allowlist_configured": True},
    }
    admin = me(client, Authorization=f"Bearer {mint('ops', tenant='ops')}")
    assert (admin["tenant_id"], admin["is_admin"], admin["legacy"]) == ("ops", True, False)
    assert "open_mode" not in admin


# --- against the session Daphne and workers ---------------------------------------------------


def ws_close_code(url: str, token: str) -> int:
    with connect(url, additional_headers=bearer(token)) as ws, pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=10)
    assert info.value.rcvd is not None
    return info.value.rcvd.code


@pytest.mark.usefixtures("agents", "stack")
def test_runs_and_the_websocket_honour_token_scopes_and_tenants(lc: Any, http: httpx.Client, web: str) -> None:
    mint("ops")  # the runtime leaves open mode
    creator, reader = mint("creator", ["runs:create"]), mint("reader", ["runs:read"])
    outsider, publisher = mint("outsider", ["runs:read"], tenant="beta"), mint("pub", ["channel:publish"])
    body = {"agent": "echo", "prompt": "hi", "background": True}
    assert http.post("/v1/runs", json=body).status_code == 401
    denied = http.post("/v1/runs", json=body, headers=bearer(reader))
    assert denied.status_code == 403 and denied.headers["WWW-Authenticate"] == 'Bearer scope="runs:create"'
    created = http.post("/v1/runs", json=body, headers=bearer(creator))
    assert created.status_code == 202, created.text
    run_id = created.json()["run_id"]
    wait_status(run_id, "completed")
    assert http.get(f"/v1/runs/{run_id}", headers=bearer(reader)).json()["run_id"] == run_id
    assert http.get(f"/v1/runs/{run_id}", headers=bearer(outsider)).status_code == 404

    url = web.replace("http://", "ws://") + f"/ws/runs/{run_id}/"
    assert ws_close_code(url, publisher) == 4403  # no runs:read
    assert ws_close_code(url, "lct_unknown") == 4401
    assert ws_close_code(url, outsider) == 4404  # another tenant's run
    with connect(url, additional_headers=bearer(reader)) as ws:
        events = [json.loads(raw)["event"] for raw in ws]
    assert events[-1] == "done"
    with connect(url, subprotocols=[Subprotocol(f"bearer.{reader}")]) as ws:
        assert json.loads(ws.recv(timeout=10))["event"]


# --- the per-process lookup cache (LOOMCYCLE_AUTH_CACHE_TTL_SECONDS) ------------------------


@pytest.mark.django_db
def test_a_token_lookup_is_cached_and_a_token_write_voids_it(lc: Any, django_assert_num_queries: Any) -> None:
    # The epoch read once, as in production.
    lc.LOOMCYCLE = dataclasses.replace(lc.LOOMCYCLE, auth_epoch_check_ms=60_000)
    token = mint("reader", ["runs:read"])
    assert authenticate(token, "10.0.0.9").subject == "tok-reader"
    with django_assert_num_queries(0):
        assert authenticate(token, "10.0.0.9").subject == "tok-reader"
    tokens.token_retire(name="reader")  # this process forgets at once
    with pytest.raises(Unauthorized):
        authenticate(token, "10.0.0.9")


@pytest.mark.django_db
def test_another_process_bumping_the_epoch_voids_cached_lookups(lc: Any) -> None:
    lc.LOOMCYCLE = dataclasses.replace(lc.LOOMCYCLE, auth_epoch_check_ms=0)
    token = mint("reader", ["runs:read"])
    digest = tokens.token_hash(token)
    authenticate(token, "10.0.0.9")
    assert auth_cache.lookup(digest) is not None
    sync_client().incr(auth_cache.EPOCH_KEY)  # what a token write elsewhere does after its commit
    assert auth_cache.lookup(digest) is None
    lc.LOOMCYCLE = dataclasses.replace(lc.LOOMCYCLE, auth_cache_ttl_seconds=0)  # 0 turns the cache off
    authenticate(token, "10.0.0.9")
    assert auth_cache.lookup(digest) is None


@pytest.mark.django_db(transaction=True)
def test_a_retired_token_stops_working_on_the_web_process_at_once(lc: Any, web: str) -> None:
    admin = mint("ops")
    with httpx.Client(base_url=web, headers=bearer(admin)) as http:
        assert http.get("/v1/_me").status_code == 200
        assert http.get("/v1/_me").status_code == 200  # now from the web process's cache
        with_legacy(lc)
        tokens.token_retire(name="ops")  # commits, then bumps the epoch the web process checks
        assert http.get("/v1/_me").status_code == 401
