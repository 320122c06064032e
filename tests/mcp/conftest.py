"""The MCP client tests' setup: this process's network settings made the same as the
workers' (tests/conftest.py stack_env): hosts localhost, 127.0.0.1 and example.com;
only `localhost` may resolve to a non-public address."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from apps.mcp.client import calls
from apps.substrate.kinds import get_kind
from apps.substrate.services import Author, def_dispatch
from tests.mcp.servers import Recorder, serving


@pytest.fixture
def mcp_net(settings: Any) -> Any:
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE,
        http_host_allowlist=("localhost", "127.0.0.1", "example.com"),
        http_private_host_allowlist=("localhost",),
        http_caller_authoritative=False,
    )
    yield settings
    calls.shutdown()  # the sessions this process opened (discovery's are one-off; calls' are pooled)


@pytest.fixture(scope="module")
def loopback() -> Iterator[tuple[int, Recorder]]:
    """The SDK-built streamable-HTTP server, one per module: (port, recorder)."""
    with serving() as served:
        yield served


def mcpserver_op(tenant_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """An MCPServerDef op as the operator plane of `tenant_id` performs it."""
    return def_dispatch(get_kind("mcpserver"), Author(tenant_id=tenant_id, subject="ops"), body)
