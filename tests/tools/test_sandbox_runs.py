"""The Bash sandbox through real runs (real workers and web, the mock provider playing a
script; tests/loomcycle.test.yaml `files-rw`): from inside a command, every way out we know
of is tried and must fail; a fork bomb and a memory hog are stopped by their limits while
the worker goes on with the run."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.conf import settings

from apps.runs.models import RunStatus
from loomcycle_project import instance_secrets
from tests.conftest import wait_status
from tests.factories.tools import results, scripted
from tests.procs import WorkerPool

pytestmark = [
    pytest.mark.usefixtures("agents"),
    pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap (.ci/run installs it)"),
]


def runtime_pids() -> list[int]:
    """This suite's runtime processes (web, workers, beat, and pytest itself): those whose
    environment holds the suite's DATABASE_URL. Read as root, as an attacker would like to."""
    marker = f"LOOMCYCLE_DATA_DIR={os.environ['LOOMCYCLE_DATA_DIR']}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            data = environ.read_bytes()
        except OSError:
            continue
        if marker in data and b"DATABASE_URL=" in data:
            found.append(int(environ.parent.name))
    return found


def held(name: str, attempt: str) -> dict[str, object]:
    """One escape attempt: a Bash call printing `ESCAPED <name>` if `attempt` succeeds."""
    command = f"if {{ {attempt}; }} >/dev/null 2>&1; then echo 'ESCAPED {name}'; else echo 'held {name}'; fi"
    return {"tool": "Bash", "input": {"command": command, "timeout_seconds": 20}}


def escape_attempts(web: str) -> list[dict[str, object]]:
    data_dir = Path(settings.LOOMCYCLE.data_dir)
    secrets = instance_secrets.path(data_dir)
    pg_host = str(settings.DATABASES["default"]["OPTIONS"]["host"])  # the embedded server's socket directory
    redis_sock = settings.REDIS_URL.split("://", 1)[-1].split("?", 1)[0]
    port = urlsplit(web).port
    pids = runtime_pids()
    assert len(pids) >= 4, pids  # web, two workers, beat (and this process)
    attempts = [held(f"environ of {pid}", f"grep -qa DATABASE_URL /proc/{pid}/environ") for pid in pids]
    attempts += [held(f"signal to {pid}", f"kill -0 {pid}") for pid in pids]
    return [
        *attempts,
        held("any environ", "cat /proc/*/environ | grep -qa -e DATABASE_URL -e SECRET_KEY"),
        held("secrets file", f"cat {secrets}"),
        held("embedded postgres files", f"ls -A {data_dir}/pg | grep -q ."),  # the volume's parents are bare
        held("postgres socket dir", f"ls -A {pg_host} | grep -q PGSQL"),
        held("redis socket", f"test -S {redis_sock}"),
        held("checkout", f"cat {settings.BASE_DIR}/manage.py"),
        held("env file", f"cat {settings.BASE_DIR}/.loomcycle.env"),
        held("web over loopback", f"bash -c 'echo > /dev/tcp/127.0.0.1/{port}'"),
        # no interface but loopback: nothing to route by (no packet is sent to find out)
        held("a network interface", "grep -v -e 'lo:' -e '|' /proc/net/dev | grep -q :"),
        held("dev write", "touch /dev/lc-escape"),
        held("shm past its cap", f"head -c {settings.LOOMCYCLE.bash_limit_file_bytes + 1} /dev/zero > /dev/shm/f"),
        held("system write", "touch /usr/bin/lc-escape"),
        held("shadow", "cat /etc/shadow"),
        held("nested user namespace", "unshare -Ur true"),
        held("root", "test $(id -u) -eq 0"),
    ]


@pytest.mark.usefixtures("work")
def test_every_escape_attempt_from_a_sandboxed_command_fails(stack: WorkerPool, web: str) -> None:
    # the suite's embedded Postgres keeps its password there (mode 0600): something to steal
    assert "postgres_password" in instance_secrets.load(Path(settings.LOOMCYCLE.data_dir))
    attempts = escape_attempts(web)
    run = scripted("files-rw", [{"tools": attempts}, {"text": "done"}])
    wait_status(run.id, RunStatus.COMPLETED, timeout=60)
    outcomes = [text.strip() for _, text, _ in results(run.id)]
    escaped = [o for o in outcomes if "ESCAPED" in o]
    print(f"sandbox escapes tried: {len(attempts)}, succeeded: {len(escaped)}")  # the figure for the report
    assert len(outcomes) == len(attempts) and all(o.startswith("held ") for o in outcomes), escaped or outcomes
    assert not Path("/usr/bin/lc-escape").exists()


@pytest.mark.usefixtures("work")
def test_a_fork_bomb_and_a_memory_hog_hit_their_limits_and_the_worker_goes_on(stack: WorkerPool) -> None:
    before = sorted(stack.pids())
    bomb = {"command": "b() { b | b & }; b; sleep 3", "timeout_seconds": 30}
    hog = {"command": "tail /dev/zero", "timeout_seconds": 60}
    steps = [
        {"tool": "Bash", "input": bomb},
        {"tool": "Bash", "input": hog},
        {"tool": "Bash", "input": {"command": "echo alive"}},
        {"text": "done"},
    ]
    run = scripted("files-rw", steps)
    wait_status(run.id, RunStatus.COMPLETED, timeout=120)
    (_, bombed, _), (_, hogged, hog_err), last = results(run.id)
    assert "Cannot fork" in bombed  # the process limit stopped it (the sleep ended the command)
    assert "memory exhausted" in hogged and hog_err  # the address-space limit stopped it
    assert last == ("Bash", "alive\n", False)
    assert sorted(stack.pids()) == before  # no worker died or was replaced
