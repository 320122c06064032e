"""The pytest side: options, and fixtures that start nothing until a test asks.

`loomcycle_runtime` (session scope) starts the runtime at the first test
that needs it and stops it when the session ends (also after a failure or
Ctrl-C: pytest tears session fixtures down then; an atexit hook covers an
interpreter exit past pytest's teardown; PR_SET_PDEATHSIG covers a killed
pytest). Loading the plugin only registers options and fixtures.
"""

from __future__ import annotations

import atexit
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from loomcycle_http.client import Client
from loomcycle_http.testing import client as C
from loomcycle_http.testing.runtime import Runtime, start_runtime

DEFAULT_START_TIMEOUT_S = 180.0
DEFAULT_BEARER_ENV = "LOOMCYCLE_AUTH_TOKEN"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("loomcycle", "loomcycle runtime for tests (loomcycle_http.testing)")
    group.addoption(
        "--loomcycle-config",
        action="append",
        default=None,
        metavar="FILE",
        help="a loomcycle yaml file for the runtime the session starts (repeat to layer; replaces the ini list)",
    )
    group.addoption("--loomcycle-url", default=None, help="use this running runtime instead of starting one")
    group.addoption("--loomcycle-data-dir", default=None, help="keep the started runtime's data here (reused)")
    parser.addini("loomcycle_config_files", "loomcycle yaml files, layered in order", type="paths", default=[])
    parser.addini("loomcycle_url", "use this running runtime instead of starting one", default="")
    parser.addini("loomcycle_data_dir", "keep the started runtime's data here (reused across sessions)", default="")
    parser.addini(
        "loomcycle_token_env", "env var holding the bearer for --loomcycle-url runtimes", default=DEFAULT_BEARER_ENV
    )
    parser.addini("loomcycle_start_timeout", "seconds to wait for the runtime to be ready", default="")
    parser.addini(
        "loomcycle_pass_env",
        "environment variables passed to the started runtime although the plugin drops them (provider keys, ...)",
        type="args",
        default=[],
    )
    parser.addini(
        "loomcycle_python",
        "the interpreter of an environment where loomcycle is installed, to run the runtime (default: this one)",
        default="",
    )


def _config_files(config: pytest.Config) -> list[Path]:
    given = config.getoption("loomcycle_config")
    if given:
        return [(config.invocation_params.dir / str(p)).resolve() for p in given]
    return [Path(p).resolve() for p in config.getini("loomcycle_config_files")]


def _data_dir(config: pytest.Config, factory: pytest.TempPathFactory) -> Path:
    given = config.getoption("loomcycle_data_dir")
    if given:
        return (config.invocation_params.dir / str(given)).resolve()
    ini = str(config.getini("loomcycle_data_dir"))
    if ini:
        return (config.rootpath / ini).resolve()
    return factory.mktemp("loomcycle")


def _external(config: pytest.Config) -> Runtime | None:
    url = config.getoption("loomcycle_url") or str(config.getini("loomcycle_url"))
    if not url:
        return None
    token = os.environ.get(str(config.getini("loomcycle_token_env"))) or None
    return Runtime(url=url.rstrip("/"), token=token)


def _start_timeout(config: pytest.Config) -> float:
    raw = str(config.getini("loomcycle_start_timeout"))
    try:
        return float(raw) if raw else DEFAULT_START_TIMEOUT_S
    except ValueError:
        raise pytest.UsageError(f"loomcycle_start_timeout must be a number of seconds, got {raw!r}") from None


def _pass_env(config: pytest.Config) -> list[str]:
    names = [str(n) for n in config.getini("loomcycle_pass_env")]
    bad = [n for n in names if not _ENV_NAME.fullmatch(n)]
    if bad:
        raise pytest.UsageError(f"loomcycle_pass_env takes environment variable names, got {bad}")
    return names


def _python(config: pytest.Config) -> str | None:
    """loomcycle_python as an absolute path, relative to the rootdir. Its
    symlinks are kept: a venv's interpreter finds its environment by the path
    it was started as."""
    raw = str(config.getini("loomcycle_python")).strip()
    return os.path.abspath(config.rootpath / os.path.expanduser(raw)) if raw else None


@pytest.fixture(scope="session")
def loomcycle_runtime(pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """The session's runtime: started on first use (or `--loomcycle-url`), stopped at session end."""
    external = _external(pytestconfig)
    if external is not None:
        yield external
        return
    runtime = start_runtime(
        _data_dir(pytestconfig, tmp_path_factory),
        _config_files(pytestconfig),
        _start_timeout(pytestconfig),
        python=_python(pytestconfig),
        pass_env=_pass_env(pytestconfig),
    )
    atexit.register(runtime.stop)
    try:
        yield runtime
    finally:
        runtime.stop()
        atexit.unregister(runtime.stop)


@pytest.fixture
def loomcycle_client(loomcycle_runtime: Runtime) -> Iterator[Client]:
    """A loomcycle_http client of the runtime (with its bearer token, if any; never LOOMCYCLE_TOKEN's:
    "" is no token); `.http` is its httpx client, for a route by hand."""
    with Client(loomcycle_runtime.url, token=loomcycle_runtime.token or "", timeout=30.0) as client:
        yield client


@pytest.fixture(name="run_agent")
def run_agent_fixture(loomcycle_client: Client) -> Callable[..., C.Result]:
    """`run_agent(agent, prompt, *, timeout=60, **fields) -> Result` on the session's runtime."""

    def run(agent: str, prompt: str, **fields: Any) -> C.Result:
        return C.run_agent(loomcycle_client, agent, prompt, **fields)

    return run


@pytest.fixture(name="send_input")
def send_input_fixture(loomcycle_client: Client) -> Callable[..., C.Result]:
    """`send_input(run, text, *, timeout=60) -> Result` on the session's runtime (run: a Result or a run id)."""

    def send(run: C.Result | str, text: str, **options: Any) -> C.Result:
        return C.send_input(loomcycle_client, run, text, **options)

    return send


@pytest.fixture(name="define_agent")
def define_agent_fixture(loomcycle_client: Client) -> Callable[..., dict[str, Any]]:
    """`define_agent(name, **overlay) -> dict` on the session's runtime."""

    def define(name: str, **overlay: Any) -> dict[str, Any]:
        return C.define_agent(loomcycle_client, name, **overlay)

    return define


@pytest.fixture(name="assert_tool_called")
def assert_tool_called_fixture() -> Callable[..., C.ToolCall]:
    """`assert_tool_called(result, tool, **expected)`, as a fixture too."""
    return C.assert_tool_called
