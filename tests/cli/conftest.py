"""The CLI as a subprocess (`python -m loomcycle_http`) and the client against a real web process
(one for the package, restartable on its port) and the session's workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import procs


class Web:
    """A Daphne web process on a fixed loopback port, so it can be restarted under a client."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env, self.logdir = env, logdir
        self.port = procs.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)]
        self.proc = procs.spawn([*argv, "loomcycle_project.asgi:application"], self.env, self.logdir / "cli-web.log")
        procs.wait_http(self.url + "/healthz")

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
            self.proc = None


@pytest.fixture(scope="package")  # one web process for every module here
def web_proc(stack_env: dict[str, str], logdir: Path) -> Iterator[Web]:
    web = Web(stack_env, logdir)
    web.start()
    try:
        yield web
    finally:
        web.stop()


def cli_env(web: Web, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "LOOMCYCLE_TOKEN"}
    return {**env, "LOOMCYCLE_URL": web.url, "PYTHONUNBUFFERED": "1", **extra}


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "loomcycle_http", *args]


def cli(
    web: Web, *args: str, stdin: str | None = None, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run the CLI to its end; stdout and stderr captured."""
    return subprocess.run(
        cli_argv(*args),
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=procs.ROOT,
        env=cli_env(web, **env),
    )


def json_lines(text: str) -> list[Any]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def script(*steps: dict[str, Any], before: str = "") -> str:
    """A mock-script prompt (docs/testing.md)."""
    return f"{before}MOCK_SCRIPT: {json.dumps(list(steps))}"
