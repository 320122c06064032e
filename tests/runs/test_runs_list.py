"""GET /v1/runs (the CLI's `ps`): the caller's tenant's runs only; `agent` narrows,
`tenant` focuses an admin and is ignored for anyone else; bad input is a 400."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from apps.core.types import Principal
from apps.runs import services
from apps.runs.prompt import Segment
from apps.substrate import tokens

pytestmark = pytest.mark.usefixtures("agents", "stack")


def _start(tenant: str, agent: str) -> str:
    who = Principal(tenant_id=tenant, subject="u", scopes=frozenset({"substrate:tenant"}))
    prompt = "MOCK_SCRIPT: " + json.dumps([{"text": "hi"}])
    run = services.run_create(principal=who, data=services.RunCreate(agent=agent, segments=[Segment(text=prompt)]))
    return run.id


def _listed(http: httpx.Client, headers: dict[str, str], **params: str) -> list[str]:
    resp = http.get("/v1/runs", params={"status": "all", **params}, headers=headers)
    assert resp.status_code == 200, resp.text
    return [row["run_id"] for row in resp.json()["runs"]]


def test_a_tenant_lists_only_its_own_runs(http: httpx.Client, people: dict[str, dict[str, str]]) -> None:
    acme_scripted, acme_echo, beta = _start("acme", "scripted"), _start("acme", "echo"), _start("beta", "scripted")
    assert sorted(_listed(http, people["alice"])) == sorted([acme_scripted, acme_echo])
    assert sorted(_listed(http, people["bob"])) == sorted([acme_scripted, acme_echo])  # runs:read is enough
    assert _listed(http, people["charlie"]) == [beta]
    assert _listed(http, people["alice"], agent="scripted") == [acme_scripted]
    assert sorted(_listed(http, people["alice"], tenant="beta")) == sorted([acme_scripted, acme_echo])  # not admin
    admin = {"authorization": f"Bearer {tokens.token_create(name='root', tenant_id='ops')['token']}"}
    assert _listed(http, admin, tenant="beta") == [beta]
    assert len(_listed(http, admin)) == 3


def test_a_bad_agent_name_is_a_400(http: httpx.Client, people: dict[str, Any]) -> None:
    resp = http.get("/v1/runs", params={"agent": "no spaces"}, headers=people["alice"])
    assert (resp.status_code, resp.json()["code"]) == (400, "invalid_request")
    assert http.get("/v1/runs").status_code == 401
