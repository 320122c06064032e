"""Open mode refuses cross-site browser requests (403 `cross_site_request`):
a web page the developer visits cannot drive an unauthenticated runtime on
127.0.0.1 with a "simple" form POST, while curl (no Origin) keeps working.
Exercised on the real Daphne process (the async middleware path) and on the
in-process client (the sync path)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client

from apps.runs.models import Run
from apps.substrate import tokens
from apps.substrate.models import OperatorTokenDef

FORM = {"content-type": "application/x-www-form-urlencoded"}
EVIL = {**FORM, "origin": "https://evil.example", "sec-fetch-site": "cross-site"}
IMPORT = '{"op":"create","name":"pwn","tenant_id":"ops","import_token":"attacker-chosen-value"}'


@pytest.fixture
def lc(settings: Any, tmp_path: Path) -> Any:
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, auth_token=None, audit_log_path=str(tmp_path / "audit.jsonl")
    )
    return settings


def assert_cross_site(resp: Any) -> None:
    assert resp.status_code == 403, resp.content
    body = resp.json()
    assert body["code"] == "cross_site_request" and "other sites" in body["error"]


@pytest.mark.django_db(transaction=True)
def test_a_cross_site_form_post_cannot_mint_an_admin_token_but_curl_can(http: httpx.Client, lc: Any) -> None:
    assert_cross_site(http.post("/v1/_operatortokendef", content=IMPORT, headers=EVIL))
    assert_cross_site(http.post("/v1/_operatortokendef", content=IMPORT, headers={**FORM, "origin": "null"}))
    assert not OperatorTokenDef.objects.exists()
    resp = http.post("/v1/_operatortokendef", content=IMPORT, headers=FORM)  # curl -d: no Origin
    assert resp.status_code == 200, resp.content
    assert OperatorTokenDef.objects.filter(name="pwn").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_cross_site_request_starts_no_run_and_pauses_nothing(http: httpx.Client, lc: Any, agents: None) -> None:
    run = '{"agent":"echo","prompt":"hi","background":true}'
    assert_cross_site(http.post("/v1/runs", content=run, headers=EVIL))
    assert_cross_site(http.post("/v1/runs", content=run, headers={**FORM, "sec-fetch-site": "cross-site"}))
    assert_cross_site(http.post("/v1/_pause", content="{}", headers=EVIL))
    assert not Run.objects.exists()
    assert http.get("/v1/_state").json()["state"] == "running"


@pytest.mark.django_db(transaction=True)
def test_loopback_origins_are_served_in_open_mode(http: httpx.Client, lc: Any) -> None:
    for origin in ("http://127.0.0.1:8787", "http://localhost:3000", "http://[::1]:8787", "https://app.localhost"):
        resp = http.get("/v1/_me", headers={"origin": origin, "sec-fetch-site": "same-origin"})
        assert resp.status_code == 200, (origin, resp.content)
        assert resp.json()["open_mode"] is True


@pytest.mark.django_db(transaction=True)
def test_once_a_token_exists_a_cross_site_request_meets_the_bearer_check(http: httpx.Client, lc: Any) -> None:
    tokens.token_create(name="ops", tenant_id="ops")
    resp = http.post("/v1/_operatortokendef", content=IMPORT, headers=EVIL)
    assert resp.status_code == 401, resp.content  # the browser cannot attach a bearer on its own


@pytest.mark.django_db(transaction=True)
def test_the_sync_middleware_path_refuses_the_same_requests(client: Client, lc: Any) -> None:
    resp = client.post(
        "/v1/_operatortokendef",
        IMPORT,
        content_type=FORM["content-type"],
        headers={"origin": "https://evil.example"},
    )
    assert_cross_site(resp)
    assert_cross_site(client.get("/v1/_me", headers={"sec-fetch-site": "cross-site"}))
    assert not OperatorTokenDef.objects.exists()
    assert client.get("/v1/_me", headers={"origin": "http://localhost:8787"}).status_code == 200
