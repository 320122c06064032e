"""The tenant matrix: alice and bob in tenant acme, charlie in beta. Another
tenant's run or definition is an opaque 404 (never a 403) and is never
listed, over REST and over the WebSocket; a tenant member sees its tenant's
rows. Runs against the real Daphne, workers, Postgres and Redis."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from apps.runs.models import RunStatus
from apps.substrate import tokens
from tests.conftest import wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")

AGENT = {"provider": "mock", "model": "mock-generic", "tools": ["Context"]}


def _ws_close_code(web: str, run_id: str, headers: dict[str, str]) -> int:
    url = web.replace("http://", "ws://") + f"/ws/runs/{run_id}/"
    with connect(url, additional_headers=headers) as ws, pytest.raises(ConnectionClosed) as info:
        while True:
            ws.recv(timeout=10)
    assert info.value.rcvd is not None
    return info.value.rcvd.code


def test_another_tenants_runs_are_404_and_never_listed(
    http: httpx.Client, web: str, people: dict[str, dict[str, str]]
) -> None:
    alice, bob, charlie = people["alice"], people["bob"], people["charlie"]
    created = http.post(
        "/v1/runs", headers=alice, json={"agent": "echo", "prompt": "hi", "user_id": "u1", "background": True}
    )
    assert created.status_code == 202, created.text
    run_id, agent_id = created.json()["run_id"], created.json()["agent_id"]
    wait_status(run_id, RunStatus.COMPLETED)

    # Same tenant: bob reads alice's run (whose user is alice: the token's subject wins over the wire's u1).
    assert http.get(f"/v1/runs/{run_id}", headers=bob).json()["run_id"] == run_id
    mine = http.get("/v1/users/alice/agents?status=all", headers=bob).json()["agents"]
    assert [a["run_id"] for a in mine] == [run_id]
    assert _ws_close_code(web, run_id, bob) == 1000  # streamed to the end

    # Another tenant: every by-id route is the same opaque 404.
    for method, path in (
        ("GET", f"/v1/runs/{run_id}"),
        ("GET", f"/v1/agents/{agent_id}"),
        ("GET", f"/v1/runs/{run_id}/events"),
        ("GET", f"/v1/runs/{run_id}/stream"),
        ("POST", f"/v1/agents/{agent_id}/cancel"),
        ("POST", f"/v1/runs/{run_id}/input"),
    ):
        body = {"text": "x"} if path.endswith("/input") else {}
        resp = http.request(method, path, headers=charlie, json=body)
        assert resp.status_code == 404, (method, path, resp.status_code, resp.text)
    assert http.get("/v1/users/alice/agents?status=all", headers=charlie).json()["agents"] == []
    assert _ws_close_code(web, run_id, charlie) == 4404


def test_another_tenants_definitions_are_404_and_never_listed(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    alice, bob, charlie = people["alice"], people["bob"], people["charlie"]

    def op(headers: dict[str, str], body: dict[str, Any]) -> httpx.Response:
        return http.post("/v1/_agentdef", headers=headers, json=body)

    v1 = op(alice, {"op": "create", "name": "acme-bot", "overlay": AGENT}).json()
    assert v1["tenant_id"] == "acme" and v1["created_by_agent_id"] == "a_http-admin"
    v2 = op(alice, {"op": "fork", "name": "acme-bot", "overlay": {"system_prompt": "v2"}}).json()
    assert (v2["version"], v2["tenant_id"]) == (2, "acme")

    # acme members see it; bob (runs scopes) may read the tenant plane but not write it.
    names = http.get("/v1/_agentdef/names", headers=bob).json()["names"]
    assert any(n["name"] == "acme-bot" and n["tenant_id"] == "acme" for n in names)
    denied = op(bob, {"op": "fork", "name": "acme-bot", "overlay": {}})
    assert denied.status_code == 403 and denied.headers["www-authenticate"] == 'Bearer scope="substrate:tenant"'
    run = http.post("/v1/runs", headers=bob, json={"agent": "acme-bot", "prompt": "hi", "background": True})
    assert run.status_code == 202, run.text

    # charlie (beta): 404 on every by-id op, nothing listed, the name does not resolve.
    for body in (
        {"op": "get", "def_id": v1["def_id"]},
        {"op": "retire", "def_id": v2["def_id"], "retired": True},
        {"op": "promote", "def_id": v2["def_id"]},
        {"op": "fork", "name": "acme-bot", "parent_def_id": v1["def_id"], "overlay": {}},
    ):
        resp = op(charlie, body)
        assert resp.status_code == 404 and resp.json()["code"] == "not_found", (body, resp.text)
    assert op(charlie, {"op": "list", "name": "acme-bot"}).json()["versions"] == []
    verify = op(charlie, {"op": "verify", "name": "acme-bot", "content_sha256": v1["content_sha256"]}).json()
    assert (verify["deployed"], verify["matches"]) == (False, False)
    assert not [n for n in http.get("/v1/_agentdef/names", headers=charlie).json()["names"] if n["tenant_id"] == "acme"]
    unknown = http.post("/v1/runs", headers=charlie, json={"agent": "acme-bot", "prompt": "hi", "background": True})
    assert unknown.status_code == 400 and unknown.json()["code"] == "unknown_agent"
    # charlie's own create of the same name is beta's, independent of acme's.
    beta = op(charlie, {"op": "create", "name": "acme-bot", "overlay": AGENT}).json()
    assert (beta["tenant_id"], beta["version"]) == ("beta", 1)
    assert [v["version"] for v in op(alice, {"op": "list", "name": "acme-bot"}).json()["versions"]] == [2, 1]

    # Shared (yaml) definitions are visible to every tenant; tokens are admin-plane only.
    assert op(charlie, {"op": "list", "name": "echo"}).json()["versions"] == []  # beta has no versions of its own
    assert (
        http.post("/v1/runs", headers=charlie, json={"agent": "echo", "prompt": "x", "background": True}).status_code
        == 202
    )
    for path in ("/v1/_operatortokendef/names",):
        resp = http.get(path, headers=charlie)
        assert resp.status_code == 403 and resp.headers["www-authenticate"] == 'Bearer scope="substrate:admin"'
    listed = http.post("/v1/_operatortokendef", headers=charlie, json={"op": "list"})
    assert listed.status_code == 403


def test_an_isolated_member_acts_and_reads_only_as_its_own_user(
    http: httpx.Client, web: str, people: dict[str, dict[str, str]]
) -> None:
    token = tokens.token_create(name="dave", tenant_id="acme", subject="dave", scopes=["substrate:user"])["token"]
    dave = {"authorization": f"Bearer {token}"}
    body = {"agent": "echo", "prompt": "hi", "background": True}
    alices = http.post("/v1/runs", headers=people["alice"], json={**body, "user_id": "u1"}).json()
    own = http.post("/v1/runs", headers=dave, json={**body, "user_id": "u1"}).json()  # the wire user_id is overridden
    wait_status(own["run_id"], RunStatus.COMPLETED)
    assert http.get(f"/v1/runs/{own['run_id']}", headers=dave).json()["user_id"] == "dave"
    assert http.get(f"/v1/runs/{alices['run_id']}", headers=dave).status_code == 404  # same tenant, another user
    assert http.get("/v1/users/u1/agents?status=all", headers=dave).json()["agents"] == []
    assert [a["run_id"] for a in http.get("/v1/users/dave/agents?status=all", headers=dave).json()["agents"]] == [
        own["run_id"]
    ]
    assert _ws_close_code(web, alices["run_id"], dave) == 4404
    assert http.get(f"/v1/runs/{own['run_id']}", headers=people["alice"]).status_code == 200  # the tenant sees it


def test_agent_id_is_unique_per_tenant_so_another_tenants_cannot_be_probed_or_squatted(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    body = {"agent": "echo", "prompt": "hi", "background": True, "agent_id": "handle-1"}
    alices = http.post("/v1/runs", headers=people["alice"], json=body)
    assert alices.status_code == 202, alices.text
    charlies = http.post("/v1/runs", headers=people["charlie"], json=body)  # another tenant: no 409 oracle
    assert charlies.status_code == 202, charlies.text
    assert alices.json()["run_id"] != charlies.json()["run_id"]
    again = http.post("/v1/runs", headers=people["bob"], json=body)  # same tenant as alice
    assert again.status_code == 409 and again.json()["code"] == "agent_id_in_use"

    # Each tenant's handle names its own run; an admin reading every tenant must use the run_id.
    assert http.get("/v1/agents/handle-1", headers=people["charlie"]).json()["run_id"] == charlies.json()["run_id"]
    assert http.get("/v1/agents/handle-1", headers=people["bob"]).json()["run_id"] == alices.json()["run_id"]
    admin = {"authorization": f"Bearer {tokens.token_create(name='root', tenant_id='ops')['token']}"}
    ambiguous = http.get("/v1/agents/handle-1", headers=admin)
    assert ambiguous.status_code == 409 and ambiguous.json()["code"] == "agent_id_ambiguous"
    assert http.get(f"/v1/runs/{charlies.json()['run_id']}", headers=admin).status_code == 200
    for created in (alices, charlies):
        wait_status(created.json()["run_id"], RunStatus.COMPLETED)
