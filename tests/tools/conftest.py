"""Helpers for the world-tool tests: a ToolContext as the engine builds one,
the runtime settings of a configured network, and the static `work` volume."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from apps.core.tools import ToolContext
from tests.conftest import for_sandbox
from tests.factories.tools import STATIC


def tool_context(
    *, allowed_hosts: tuple[str, ...] = ("localhost",), credentials: Mapping[str, str] | None = None
) -> ToolContext:
    return ToolContext(
        run_id="run_test",
        agent_id="agent_test",
        session_id="sess_test",
        tenant_id="",
        user_id="alice",
        agent_name="fetcher",
        agent_def_id="def_test",
        agent_def_sha256="",
        provider="mock",
        model="mock-script",
        step=0,
        call_id="call_1",
        tools=("HTTP", "WebFetch"),
        credentials=dict(credentials or {}),
        allowed_hosts=allowed_hosts,
    )


@pytest.fixture
def net(settings: Any) -> Any:
    """Network configured for `localhost` and `127.0.0.1`; only `localhost` may be non-public."""
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE,
        http_host_allowlist=("localhost", "127.0.0.1"),
        http_private_host_allowlist=("localhost",),
        http_caller_authoritative=False,
    )
    return settings


@pytest.fixture
def work() -> Iterator[Path]:
    """The static `work` volume of tests/loomcycle.test.yaml, empty for each test."""
    shutil.rmtree(STATIC, ignore_errors=True)
    for_sandbox(STATIC / "work")  # its Bash commands write here
    yield STATIC / "work"
    shutil.rmtree(STATIC, ignore_errors=True)
