"""Fixtures shared by the driver tests: `server`, the loopback HTTP server the
`wire` fixtures script, and `collect` (each test over the blocking and the
async path); see tests/gateway/wire.py. A module may define its own. And `alt_web`, the
gateway API tests' second Daphne (its own config), one per module that uses it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from tests import procs
from tests.factories.gateway import OPERATOR_KEY
from tests.gateway.wire import collect, server

__all__ = ["collect", "server"]


@pytest.fixture(scope="module")
def alt_web(
    stack_env: dict[str, str], logdir: Path, make_httpserver: HTTPServer, tmp_path_factory: Any
) -> Iterator[str]:
    """Daphne with LOOMCYCLE_EMBEDDER=none, one call per user, SSE keepalives every second and a
    provider `up` (our OpenAI driver) pointing at the pytest-httpserver on loopback."""
    config = tmp_path_factory.mktemp("alt") / "alt.yaml"
    upstream = {"driver": "openai", "dialect": "compat", "base_url": make_httpserver.url_for("/v1")}
    keyed = {**upstream, "api_key_env": "GATEWAY_TEST_OPERATOR_KEY"}  # the same upstream, with the operator's key
    config.write_text(json.dumps({"providers": {"up": upstream, "keyed": keyed}}))
    env = {
        **stack_env,
        "GATEWAY_TEST_OPERATOR_KEY": OPERATOR_KEY,
        "LOOMCYCLE_EMBEDDER": "none",
        "LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER": "1",
        "LOOMCYCLE_SSE_KEEPALIVE_MS": "1000",
        "LOOMCYCLE_CONFIG_FILES": f"{stack_env['LOOMCYCLE_CONFIG_FILES']},{config}",
    }
    port = procs.free_port()
    argv = procs.web_argv(port)
    proc = procs.spawn(argv, env, logdir / "daphne-alt.log")
    try:
        procs.wait_http(f"http://127.0.0.1:{port}/healthz")
        yield f"http://127.0.0.1:{port}"
    finally:
        procs.stop(proc)
