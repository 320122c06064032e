"""compose/ as more than one replica of each app process, checked without a Docker engine: web
and gRPC scale behind the load balancer (no host port of theirs to clash), the yaml is mounted
from the host, the bundled example agents find their provider on compose's external database,
and compose/genenv.py generates every secret the file requires (tests/test_compose.py checks
the rest of the file's shape)."""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose"
FILE = COMPOSE / "docker-compose.yml"
HAPROXY = COMPOSE / "haproxy.cfg"
APP_SERVICES = {"migrate", "web", "worker", "beat", "flower", "grpc"}
DEFAULT = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*):-([^}]*)\}$")


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    loaded: dict[str, dict[str, Any]] = yaml.safe_load(FILE.read_text())["services"]
    return loaded


def _default(value: str) -> str:
    """The value `${NAME:-default}` takes when NAME is unset."""
    match = DEFAULT.match(value)
    assert match, f"{value} is not ${{NAME:-default}}"
    return match.group(2)


def _mount(volume: str) -> tuple[str, str, str]:
    """source, target, mode of a short volume syntax (the source may hold `:-`: split from the right)."""
    source, target, mode = volume.rsplit(":", 2)
    return source, target, mode


def _port(addr: str) -> int:
    return int(addr.rpartition(":")[2])


def test_no_replicated_service_publishes_a_host_port_the_load_balancer_does(
    services: dict[str, dict[str, Any]],
) -> None:
    """`--scale web=N` (or grpc, worker) starts N containers of one service: a fixed host port of
    theirs would clash. Only single services publish; `lb` publishes the API and gRPC for all."""
    for name in ("web", "grpc", "worker", "beat", "migrate"):
        assert "ports" not in services[name], f"{name} publishes a host port: its replicas would clash"
    web = services["web"]["command"]
    web_port = int(web[web.index("-p") + 1])
    grpc_port = _port(services["grpc"]["environment"]["LOOMCYCLE_GRPC_ADDR"])
    assert services["web"]["expose"] == [str(web_port)] and services["grpc"]["expose"] == [str(grpc_port)]
    lb = services["lb"]
    assert lb["ports"] == [f"{web_port}:{web_port}", f"{grpc_port}:{grpc_port}"]
    assert lb["volumes"] == ["./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"]
    assert {name: spec["condition"] for name, spec in lb["depends_on"].items()} == {
        "web": "service_healthy",
        "grpc": "service_healthy",
    }


def _sections(text: str) -> dict[str, list[str]]:
    """haproxy.cfg as {"backend web": [its lines], ...} (comments and blank lines dropped)."""
    out: dict[str, list[str]] = {}
    current = ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not line[0].isspace():
            current = line.strip()
            out[current] = []
        else:
            out[current].append(line.strip())
    return out


def test_the_load_balancer_follows_every_replica_and_checks_healthz(services: dict[str, dict[str, Any]]) -> None:
    sections = _sections(HAPROXY.read_text())
    web = services["web"]["command"]
    web_port = int(web[web.index("-p") + 1])
    grpc_port = _port(services["grpc"]["environment"]["LOOMCYCLE_GRPC_ADDR"])
    assert f"bind :{web_port}" in sections["frontend api"] and f"bind :{grpc_port}" in sections["frontend grpc"]
    # Docker's DNS answers every replica of a service under its name; HAProxy re-resolves it.
    assert "nameserver dns 127.0.0.11:53" in sections["resolvers docker"]
    templates = {
        backend: [line for line in lines if line.startswith("server-template ")]
        for backend, lines in sections.items()
        if backend.startswith("backend ")
    }
    assert templates["backend web"][0].split()[3] == f"web:{web_port}"
    assert templates["backend grpc"][0].split()[3] == f"grpc:{grpc_port}"
    for lines in templates.values():
        assert "resolvers docker" in lines[0] and " check" in lines[0]
    assert "http-check send meth GET uri /healthz" in sections["backend web"]
    assert "http-check expect status 200" in sections["backend web"]
    assert "mode tcp" in sections["backend grpc"]  # HTTP/2 connections balanced whole
    # SSE/WebSocket streams outlive a default 30-50 s proxy timeout (keep-alive every 20 s).
    assert "timeout tunnel 1h" in sections["defaults"]


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="no haproxy on this machine (apt-get install haproxy)")
def test_haproxy_accepts_the_config() -> None:
    done = subprocess.run(["haproxy", "-c", "-f", str(HAPROXY)], capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


def test_the_yaml_is_mounted_from_the_host_into_every_app_process(services: dict[str, dict[str, Any]]) -> None:
    for name in APP_SERVICES:
        service = services[name]
        path = service["environment"]["LOOMCYCLE_CONFIG_FILES"]
        mounts = {target: (source, mode) for source, target, mode in map(_mount, service["volumes"])}
        source, mode = mounts[path]
        assert mode == "ro", name
        assert (COMPOSE / _default(source)).resolve() == ROOT / "loomcycle.yaml", name
    assert "COPY" in (COMPOSE / "Dockerfile").read_text()  # the image copies the tree, less /.dockerignore's
    assert "/loomcycle.yaml" in (ROOT / ".dockerignore").read_text().splitlines()


def _registered(env: dict[str, str], yaml_path: Path) -> tuple[list[str], list[str]]:
    """In a child process with this environment: the providers the runtime registers, and those
    the yaml's agents name."""
    probe = (
        "import django, json; django.setup()\n"
        "from pathlib import Path\n"
        "from apps.core.config import load_config\n"
        "from apps.gateway.providers.registry import provider_ids\n"
        f"agents = load_config([Path({str(yaml_path)!r})])['agents']\n"
        "print(json.dumps([provider_ids(), sorted({a['provider'] for a in agents.values()})]))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    registered, named = yaml.safe_load(done.stdout.decode().splitlines()[-1])
    return registered, named


def test_the_bundled_agents_find_their_provider_on_composes_external_database(
    services: dict[str, dict[str, Any]], stack_env: dict[str, str]
) -> None:
    """compose runs on an external Postgres, where the mock providers are off unless asked for;
    the bundled example's agents all run on the mock, so compose asks for it by default."""
    app_env = services["web"]["environment"]
    mock_default = _default(app_env["LOOMCYCLE_MOCK_ENABLED"])
    source = _default(_mount(services["web"]["volumes"][0])[0])
    env = {k: v for k, v in stack_env.items() if k not in ("LOOMCYCLE_EMBEDDED_POSTGRES", "LOOMCYCLE_MOCK_ENABLED")}
    env |= {"DJANGO_SETTINGS_MODULE": "loomcycle_project.settings", "LOOMCYCLE_MOCK_ENABLED": mock_default}
    registered, named = _registered(env, (COMPOSE / source).resolve())
    assert named and set(named) <= set(registered), f"agents name {named}, compose registers {registered}"
    # Without the setting (compose before it), the same agents would find no provider.
    del env["LOOMCYCLE_MOCK_ENABLED"]
    registered, named = _registered(env, (COMPOSE / source).resolve())
    assert not set(named) & set(registered)


def _required(text: str) -> set[str]:
    return set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*):\?", text))


def test_genenv_generates_every_required_secret_once_into_a_private_file(tmp_path: Path) -> None:
    target = tmp_path / ".env"
    target.write_text("LOOMCYCLE_LOG_FORMAT=plain\nexport POSTGRES_PASSWORD=kept")  # an operator's own lines
    argv = [sys.executable, str(COMPOSE / "genenv.py"), str(target)]
    first = subprocess.run(argv, capture_output=True, timeout=60, check=True)
    text = target.read_text()
    values = dict(line.removeprefix("export ").split("=", 1) for line in text.splitlines())
    assert set(values) == _required(FILE.read_text()) | {"LOOMCYCLE_LOG_FORMAT"}
    assert values["POSTGRES_PASSWORD"] == "kept" and values["LOOMCYCLE_LOG_FORMAT"] == "plain"
    for name in _required(FILE.read_text()) - {"POSTGRES_PASSWORD", "LOOMCYCLE_FLOWER_BASIC_AUTH"}:
        assert re.fullmatch(r"[0-9a-f]{64}", values[name]), name  # hex: no quoting in a URL
    assert re.fullmatch(r"flower:[0-9a-f]{32}", values["LOOMCYCLE_FLOWER_BASIC_AUTH"])
    assert not any(value in first.stdout.decode() for value in values.values())  # never printed
    second = subprocess.run(argv, capture_output=True, timeout=60, check=True)
    assert target.read_text() == text and b"already set" in second.stdout  # a second run changes nothing


def test_genenv_creates_the_file_readable_by_its_owner_only(tmp_path: Path) -> None:
    target = tmp_path / ".env"
    subprocess.run([sys.executable, str(COMPOSE / "genenv.py"), str(target)], capture_output=True, check=True)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
