"""Open mode answers loopback host names only (DNS rebinding), decided per
request from LOOMCYCLE_AUTH_TOKEN *and* the admin operator tokens in the
database; `manage.py up`'s open-mode warning and bind refusal likewise."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.testing import WebsocketCommunicator
from django.core.management.base import CommandError
from django.db import DatabaseError
from django.test import Client, override_settings

from apps.substrate import openmode as middleware
from apps.substrate import tokens
from apps.substrate.websocket import BrowserOriginValidator, browser_origin_validator
from loomcycle_project.management.commands.up import starts_in_open_mode

FOREIGN = "evil.example"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1:8787", "[::1]:8787", "app.localhost", "LocalHost:80")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(autouse=True)
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    fake = Clock()
    monkeypatch.setattr(middleware, "_clock", fake)
    middleware.reset_open_mode_cache()
    yield fake
    middleware.reset_open_mode_cache()  # no cached answer leaks into other tests


@pytest.fixture
def lc(settings: Any, tmp_path: Path) -> Any:
    """No legacy token, and an audit log of this test's own."""
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, auth_token=None, audit_log_path=str(tmp_path / "audit.jsonl")
    )
    return settings


def mint(name: str, scopes: list[str] | None = None) -> str:
    token: str = tokens.token_create(name=name, tenant_id="ops", scopes=scopes)["token"]
    return token


def me(client: Client, host: str, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return client.get("/v1/_me", HTTP_HOST=host, headers=headers)


def assert_open_mode_host(resp: Any) -> None:
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["code"] == "open_mode_host" and body["details"] == {} and "loopback" in body["error"]


# --- HTTP ---------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_open_mode_refuses_a_foreign_host_and_serves_loopback_names(lc: Any, client: Client) -> None:
    assert_open_mode_host(me(client, FOREIGN))
    assert_open_mode_host(me(client, "localhost.evil.example"))
    assert_open_mode_host(me(client, "127.0.0.1.nip.io"))
    for host in LOOPBACK_HOSTS:
        resp = me(client, host)
        assert resp.status_code == 200, (host, resp.content)
        assert resp.json()["open_mode"] is True


@pytest.mark.django_db(transaction=True)
def test_any_live_token_closes_open_mode_and_a_foreign_host_is_then_served(
    lc: Any, client: Client, clock: Clock
) -> None:
    assert me(client, "localhost").json()["open_mode"] is True
    reader = mint("reader", ["runs:read"])  # a token write voids the cached answer (this process at once,
    assert me(client, FOREIGN, reader).json()["scopes"] == ["runs:read"]  # others via the epoch)
    assert me(client, "localhost").status_code == 401  # a tenant's narrow token closes open mode too
    admin = mint("ops")
    resp = me(client, FOREIGN, admin)
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert (body["subject"], body["tenant_id"], body["is_admin"]) == ("tok-ops", "ops", True)
    assert "open_mode" not in body
    assert me(client, FOREIGN).status_code == 401  # the bearer is the boundary now
    assert me(client, FOREIGN, reader).json()["scopes"] == ["runs:read"]
    assert me(client, "localhost").status_code == 401  # and loopback needs one too


@pytest.mark.django_db(transaction=True)
def test_retiring_the_last_admin_token_reopens_the_host_check_at_once(lc: Any, client: Client, clock: Clock) -> None:
    admin = mint("ops")
    assert me(client, FOREIGN, admin).status_code == 200  # closed, cached at t=0
    with override_settings(LOOMCYCLE=dataclasses.replace(lc.LOOMCYCLE, auth_token="x")):
        tokens.token_retire(name="ops")  # the last admin token: allowed only beside an env token
    assert_open_mode_host(me(client, FOREIGN, admin))  # the write voided the cached "closed"
    assert me(client, "localhost").json()["open_mode"] is True


@pytest.mark.django_db(transaction=True)
def test_the_env_token_closes_open_mode_without_a_database_lookup(
    lc: Any, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unexpected() -> bool:
        raise AssertionError("no token-store lookup with LOOMCYCLE_AUTH_TOKEN set")

    monkeypatch.setattr(middleware, "live_token_exists", unexpected)
    lc.LOOMCYCLE = dataclasses.replace(lc.LOOMCYCLE, auth_token="env-secret")
    assert me(client, FOREIGN).status_code == 401
    assert me(client, FOREIGN, "env-secret").json()["legacy"] is True


@pytest.mark.django_db(transaction=True)
def test_a_token_store_error_refuses_a_foreign_host_as_the_outage_it_is(
    lc: Any, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail closed, but with 503 database_unavailable: a deployed runtime cut off from Postgres
    (issue 41's partitions) must not tell its clients to call a loopback name."""
    calls: list[int] = []

    def broken() -> bool:
        calls.append(1)
        raise DatabaseError("token store down")

    monkeypatch.setattr(middleware, "live_token_exists", broken)
    refused = me(client, FOREIGN, "lct_whatever")
    assert (refused.status_code, refused.json()["code"]) == (503, "database_unavailable")
    assert refused["Retry-After"] == "2"
    assert calls == [1]
    assert middleware.open_mode() is True  # an error is never cached: the next check asks again
    assert calls == [1, 1]


@pytest.mark.django_db(transaction=True)
def test_a_public_name_in_allowed_hosts_ends_open_mode(lc: Any, client: Client) -> None:
    """A proxy or a DNS name fronts the runtime: loopback peers are no longer the developer."""

    def configure(*hosts: str) -> None:  # as settings.py does from LOOMCYCLE_ALLOWED_HOSTS
        lc.ALLOWED_HOSTS = list(hosts) or ["*"]
        lc.LOOMCYCLE = dataclasses.replace(lc.LOOMCYCLE, allowed_hosts=hosts)

    configure("localhost", ".localhost", "127.0.0.1")  # loopback names only: still open
    assert me(client, "localhost").json()["open_mode"] is True
    for public in (("lab.example", "localhost", "127.0.0.1"), (".dev.example", "localhost", "127.0.0.1")):
        configure(*public)
        assert me(client, "localhost").status_code == 401, public
        assert me(client, "127.0.0.1").status_code == 401, public  # a same-host proxy's own requests
    assert me(client, "box.dev.example").status_code == 401
    configure()  # unset: `*`, no explicit name
    assert_open_mode_host(me(client, "lab.example"))


def test_loopback_names() -> None:
    for name in ("localhost", "127.0.0.1", "[::1]", "a.localhost", "a.b.localhost"):
        assert middleware.is_loopback_name(name), name
    for name in ("", "evil.example", "localhost.evil.example", "127.0.0.2", "::1", "localhostx", "xlocalhost"):
        assert not middleware.is_loopback_name(name), name


# --- WebSocket ----------------------------------------------------------------------------------


class Accepting(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await self.accept()


async def _handshake(headers: list[tuple[bytes, bytes]]) -> bool:
    app = browser_origin_validator(Accepting.as_asgi())
    communicator = WebsocketCommunicator(app, "/ws/runs/r_x/", headers=headers)
    connected, _ = await communicator.connect(timeout=10)
    await communicator.disconnect()
    return bool(connected)


def handshake(host: str, origin: str | None = None) -> bool:
    headers = [(b"host", host.encode())]
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return bool(async_to_sync(_handshake)(headers))


@pytest.mark.django_db(transaction=True)
def test_websocket_handshakes_follow_the_same_rule(lc: Any, clock: Clock) -> None:
    assert handshake("127.0.0.1:8787")
    assert handshake("localhost:8787", "http://localhost:8787")
    assert handshake("[::1]:8787", "http://[::1]:8787")
    assert not handshake(f"{FOREIGN}:8787")  # DNS rebinding
    assert not handshake(f"{FOREIGN}:8787", f"http://{FOREIGN}:8787")
    assert not handshake("127.0.0.1:8787", f"http://{FOREIGN}")  # cross-site page, open API
    assert mint("ops")  # closes open mode at once in this process
    assert handshake(f"{FOREIGN}:8787")  # the bearer check in the consumer is the boundary now
    assert handshake(f"{FOREIGN}:8787", f"https://{FOREIGN}")


@pytest.mark.django_db(transaction=True)
def test_websocket_origins_still_follow_explicit_allowed_hosts(lc: Any, clock: Clock) -> None:
    lc.LOOMCYCLE = dataclasses.replace(lc.LOOMCYCLE, auth_token="env-secret")
    lc.ALLOWED_HOSTS = ["api.example"]
    assert handshake("api.example", "https://api.example")
    assert not handshake("api.example", f"https://{FOREIGN}")
    assert handshake("api.example")  # no Origin: not a browser page


def test_the_asgi_websocket_route_is_wrapped() -> None:
    from loomcycle_project.asgi import application

    assert isinstance(application.app.application_mapping["websocket"], BrowserOriginValidator)


# --- manage.py up ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_up_accepts_any_operator_token_as_a_credential_and_says_when_no_admin_exists(lc: Any) -> None:
    assert starts_in_open_mode("127.0.0.1") is True
    assert starts_in_open_mode("::1") is True
    with pytest.raises(CommandError, match="non-loopback"):
        starts_in_open_mode("0.0.0.0")
    mint("reader", ["runs:read"])
    assert starts_in_open_mode("192.0.2.10") is False  # open mode is over: the bearer is the boundary
    assert middleware.admin_credential_missing() is True  # `up` warns: nobody can administer it
    mint("ops")
    assert middleware.admin_credential_missing() is False
    assert starts_in_open_mode("0.0.0.0") is False
    assert starts_in_open_mode("127.0.0.1") is False  # and no OPEN MODE warning


@pytest.mark.django_db
def test_up_accepts_the_env_token_without_a_database_lookup(lc: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def unexpected() -> bool:
        raise AssertionError("no token-store lookup with LOOMCYCLE_AUTH_TOKEN set")

    monkeypatch.setattr(middleware, "live_token_exists", unexpected)
    lc.LOOMCYCLE = dataclasses.replace(lc.LOOMCYCLE, auth_token="env-secret")
    assert starts_in_open_mode("0.0.0.0") is False
