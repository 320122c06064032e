"""Identity from the token (SPEC 8 tenant rules, issue 16 item 14): a tenant
token's tenant and subject override the request's `tenant_id`/`user_id`
(logged `identity_overridden`); only admins, the legacy token, open mode and
a token an admin granted `runs:act-as-user` may name the user."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from apps.core.types import Principal
from apps.gateway.models import GatewayCall
from apps.runs import services
from apps.runs.models import Run, RunStatus
from apps.runs.prompt import Segment
from apps.substrate import tokens
from tests.conftest import wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents", "stack")

RUN = {"agent": "echo", "prompt": "hi", "background": True}


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_a_tenant_token_cannot_start_runs_or_calls_as_another_user_or_tenant(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    spoof = http.post("/v1/runs", headers=people["alice"], json={**RUN, "user_id": "mallory", "tenant_id": "beta"})
    assert spoof.status_code == 202, spoof.text
    run = wait_status(spoof.json()["run_id"], RunStatus.COMPLETED)
    assert (run.tenant_id, run.user_id) == ("acme", "alice")

    # Without a user_id the run is the token's subject's too.
    plain = http.post("/v1/runs", headers=people["bob"], json=RUN).json()
    assert Run.objects.get(id=plain["run_id"]).user_id == "bob"

    call = {"loomcycle_provider": "mock", "model": "mock-generic", "messages": [{"role": "user", "content": "hi"}]}
    resp = http.post("/v1/chat/completions", headers=people["alice"], json={**call, "user": "mallory"})
    assert resp.status_code == 200, resp.text
    row = wait_for(lambda: GatewayCall.objects.filter(request_id=resp.headers["x-request-id"]).first())
    assert (row.tenant_id, row.user_id) == ("acme", "alice")


def test_an_admin_granted_act_as_user_token_names_users_within_its_own_tenant(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    body = {"op": "create", "name": "backend", "tenant_id": "acme", "scopes": ["runs:create", "runs:act-as-user"]}
    # Only an admin grants it: a tenant token cannot mint tokens at all.
    assert http.post("/v1/_operatortokendef", headers=people["alice"], json=body).status_code == 403
    admin = tokens.token_create(name="root", tenant_id="ops", scopes=["substrate:admin"])["token"]
    minted = http.post("/v1/_operatortokendef", headers=_bearer(admin), json=body)
    assert minted.status_code == 200, minted.text
    backend = _bearer(minted.json()["token"])

    made = http.post("/v1/runs", headers=backend, json={**RUN, "user_id": "end-user-7", "tenant_id": "beta"})
    assert made.status_code == 202, made.text
    run = wait_status(made.json()["run_id"], RunStatus.COMPLETED)
    assert (run.tenant_id, run.user_id) == ("acme", "end-user-7")


@pytest.mark.parametrize(
    ("principal", "expected", "logged"),
    [
        (Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"})), "alice", True),
        (Principal(tenant_id="acme", subject="app", scopes=frozenset({"runs:act-as-user"})), "u9", False),
        (Principal(tenant_id="", subject="ops", scopes=frozenset({"substrate:admin"})), "u9", False),
        (Principal(tenant_id="acme", subject="d", scopes=frozenset({"substrate:user", "runs:act-as-user"})), "d", True),
    ],
)
def test_the_override_is_logged_identity_overridden(
    principal: Principal, expected: str, logged: bool, caplog: pytest.LogCaptureFixture
) -> None:
    data = services.RunCreate(agent="echo", segments=[Segment(text="hi")], user_id="u9", tenant_id="elsewhere")
    with caplog.at_level(logging.INFO, logger="loomcycle.auth"):
        run = services.run_create(principal=principal, data=data)
    assert (run.tenant_id, run.user_id) == (principal.tenant_id, expected)
    messages: list[Any] = [r.getMessage() for r in caplog.records if "identity_overridden" in r.getMessage()]
    assert any("kind=tenant wire='elsewhere'" in m for m in messages)
    assert any("kind=subject wire='u9'" in m for m in messages) is logged
    wait_status(run.id, RunStatus.COMPLETED)
