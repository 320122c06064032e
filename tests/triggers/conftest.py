"""Web processes with the webhook receiver mounted, and helpers to define
webhooks and send signed deliveries to them."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.substrate.kinds import get_kind
from apps.substrate.services import Author, def_dispatch
from tests.conftest import daphne

OPS = Author(tenant_id="", subject="ops", is_admin=True, agent_id="a_http-admin")
SECRET = "wh-s3cret"
BEARER = "wh-bearer-token"
GH_SECRET = "gh-allowlisted"
WEB_ENV = {
    "LOOMCYCLE_WEBHOOKS_ENABLED": "1",
    "LOOMCYCLE_WH_SECRET": SECRET,
    "LOOMCYCLE_WH_BEARER": BEARER,
    "LOOMCYCLE_WH_EMPTY": "",
    "LOOMCYCLE_WEBHOOKS_ENV_ALLOWLIST": "GH_HOOK_SECRET",
    "GH_HOOK_SECRET": GH_SECRET,
    "NOT_ALLOWED_SECRET": "nope",
}


@pytest.fixture(scope="session")
def hook_webs(stack_env: dict[str, str], logdir: Path) -> Iterator[list[str]]:
    """Two web processes with the receiver mounted (same database, same Redis)."""
    with (
        daphne(stack_env, logdir, "daphne-webhooks-1", **WEB_ENV) as one,
        daphne(stack_env, logdir, "daphne-webhooks-2", **WEB_ENV) as two,
    ):
        yield [one, two]


@pytest.fixture(scope="session")
def open_hook_web(stack_env: dict[str, str], logdir: Path) -> Iterator[str]:
    """A web process that also answers `auth.kind: none` webhooks."""
    env = {**WEB_ENV, "LOOMCYCLE_WEBHOOKS_ALLOW_UNAUTHENTICATED": "1"}
    with daphne(stack_env, logdir, "daphne-webhooks-open", **env) as base:
        yield base


def define(name: str, **overlay: Any) -> dict[str, Any]:
    """Create a shared WebhookDef (defaults: spawn `echo`, hmac with LOOMCYCLE_WH_SECRET)."""
    body = {"agent": "echo", "auth": {"signing_secret_env": "LOOMCYCLE_WH_SECRET"}, **overlay}
    return def_dispatch(get_kind("webhook"), OPS, {"op": "create", "name": name, "overlay": body})


def mac(message: bytes, secret: str = SECRET) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def github(body: bytes, secret: str = SECRET) -> dict[str, str]:
    return {"X-Hub-Signature-256": "sha256=" + mac(body, secret)}


def stripe(body: bytes, at: int | None = None) -> dict[str, str]:
    t = int(time.time()) if at is None else at
    return {"X-Loomcycle-Signature": f"t={t},v1={mac(str(t).encode() + b'.' + body)}"}


def payload(**values: Any) -> bytes:
    return json.dumps(values).encode()


def post(base: str, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    """`body`: bytes, or an iterator of chunks (sent chunked, without a Content-Length)."""
    return httpx.post(f"{base}/v1/_webhooks/{path}", content=body, headers=headers or {}, timeout=60)
