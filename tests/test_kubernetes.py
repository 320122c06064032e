"""deploy/kubernetes checked without a cluster: the base, every combination of its components and
the example overlay rendered by kustomize (kubectl's, the one `kubectl apply -k` runs), each object
validated against the Kubernetes API schemas (kubernetes-validate, offline) of the oldest and the
newest version we claim, then the rules docs/operations.md ("Kubernetes") states: one beat, the
migration before the rollout, secrets from the Secret only, probes, requests, disruption budgets,
a grace long enough for a warm worker stop, every variable one the runtime reads."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import psycopg
import pytest
import yaml
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
KUBE = ROOT / "deploy" / "kubernetes"
COMPONENTS = ("grpc", "example-agents")
# The Kubernetes versions the manifests are validated against: the oldest we claim (native gRPC
# probes are GA since 1.27) and the newest kubernetes-validate ships.
VERSIONS = ("1.30.0", "1.37.0")
SECRET = "loomcycle"
# What only the Secret may carry (docs/operations.md, "Kubernetes").
SECRET_KEYS = {
    "DATABASE_URL",
    "REDIS_URL",
    "DJANGO_SECRET_KEY",
    "LOOMCYCLE_OPERATOR_TOKEN_PEPPER",
    "LOOMCYCLE_AUTH_TOKEN",
    "LOOMCYCLE_FLOWER_BASIC_AUTH",
}
# Variables the runtime does not read itself, and who does.
OTHERS_VARIABLES = {"FLOWER_BASIC_AUTH": "Flower's own option (flower/command.py reads FLOWER_* variables)"}
SCHEMA_USERS = ("web", "worker", "beat")  # the processes that wait for the migration


def _kustomize() -> list[str]:
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    pytest.fail("neither kubectl (which bundles kustomize) nor kustomize is installed: install kubectl")


def render(directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run([*_kustomize(), str(directory)], capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _combination(tmp: Path, components: tuple[str, ...]) -> Path:
    """A kustomization of the base with these components (paths relative: kustomize refuses absolute ones)."""

    def rel(p: Path) -> str:
        return os.path.relpath(p, tmp)

    spec = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [rel(KUBE / "base")],
        "components": [rel(KUBE / "components" / name) for name in components],
    }
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(spec))
    return tmp


def _subsets() -> list[tuple[str, ...]]:
    return [c for n in range(len(COMPONENTS) + 1) for c in itertools.combinations(COMPONENTS, n)]


RENDERINGS = [f"base+{'+'.join(c) or 'nothing'}" for c in _subsets()] + ["overlays/example"]


@pytest.fixture(scope="module", params=RENDERINGS)
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    name: str = request.param
    if name.startswith("overlays/"):
        return render(KUBE / name)
    components = tuple(c for c in name.removeprefix("base+").split("+") if c != "nothing")
    return render(_combination(tmp_path_factory.mktemp("kustomize"), components))


def _objects(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def _deployment(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    return _objects(docs, "Deployment")[f"loomcycle-{component}"]


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


def _env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The settings every pod reads: the generated ConfigMap loomcycle-env-<hash>."""
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("loomcycle-env-")]
    data: dict[str, str] = config["data"]
    return data


def _workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] in ("Deployment", "Job")]


def test_every_object_is_valid_against_the_kubernetes_schemas(rendered: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in rendered}
    assert {"Deployment", "Job", "Service", "ConfigMap", "PodDisruptionBudget"} <= kinds
    for doc, version in itertools.product(rendered, VERSIONS):
        kubernetes_validate.validate(doc, version, strict=True)  # raises with the failing path


def test_web_workers_beat_flower_and_the_migration_job_are_all_there(rendered: list[dict[str, Any]]) -> None:
    assert set(_objects(rendered, "Deployment")) == {f"loomcycle-{c}" for c in ("web", "worker", "beat", "flower")}
    (job,) = _objects(rendered, "Job").values()
    assert _pod(job)["containers"][0]["command"] == ["python", "manage.py", "boot"]
    assert _pod(job)["restartPolicy"] == "Never"
    assert set(_objects(rendered, "Service")) == {"loomcycle-web", "loomcycle-flower"}


def test_exactly_one_beat_stopped_before_its_replacement_starts(rendered: list[dict[str, Any]]) -> None:
    beat = _deployment(rendered, "beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    assert "loomcycle-beat" not in _objects(rendered, "PodDisruptionBudget")


def test_the_schema_users_start_only_after_the_migration(rendered: list[dict[str, Any]]) -> None:
    """The runbook's order (migrate, then start the new release beside the old one): each pod
    that touches the schema waits in an init container until `migrate --check` passes, and a
    rollout keeps every old pod until a new one is ready (maxUnavailable 0)."""
    for component in SCHEMA_USERS:
        deployment = _deployment(rendered, component)
        (init,) = _pod(deployment)["initContainers"]
        assert "python manage.py migrate --check" in init["command"][-1], component
        assert {c["image"] for c in _containers(_pod(deployment))} == {init["image"]}, component  # one release
        if component != "beat":
            assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, component


def test_secrets_come_only_from_the_secret(rendered: list[dict[str, Any]]) -> None:
    for config in _objects(rendered, "ConfigMap").values():
        assert not SECRET_KEYS & set(config.get("data", {})), config["metadata"]["name"]
    assert not _objects(rendered, "Secret")  # created beside the kustomization, never kept in it
    for workload in _workloads(rendered):
        for container in _containers(_pod(workload)):
            refs = [ref["secretRef"]["name"] for ref in container.get("envFrom", []) if "secretRef" in ref]
            assert refs == [SECRET], (workload["metadata"]["name"], container["name"])
            for var in container.get("env", []):
                assert "value" not in var or var["name"] not in SECRET_KEYS | {"FLOWER_BASIC_AUTH"}
    (flower,) = _pod(_deployment(rendered, "flower"))["containers"]
    auth = {v["name"]: v for v in flower["env"]}["FLOWER_BASIC_AUTH"]
    assert auth["valueFrom"]["secretKeyRef"] == {"name": SECRET, "key": "LOOMCYCLE_FLOWER_BASIC_AUTH"}


def test_every_variable_is_one_the_runtime_reads(rendered: list[dict[str, Any]]) -> None:
    env_py = (ROOT / "loomcycle_project" / "env.py").read_text()
    names = set(_env(rendered)) | SECRET_KEYS
    for workload in _workloads(rendered):
        for container in _containers(_pod(workload)):
            names |= {v["name"] for v in container.get("env", [])}
            names |= set(re.findall(r"\$\(([A-Z0-9_]+)\)", " ".join(container.get("command", []))))
    for name in names - set(OTHERS_VARIABLES):
        assert f'"{name}"' in env_py, f"{name}: env.py does not read it"
    for name in re.findall(r"\$\(([A-Z0-9_]+)\)", yaml.safe_dump(rendered)):
        assert name in _env(rendered), f"$({name}) is expanded from no variable of loomcycle-env"


def test_the_yaml_is_mounted_from_a_configmap_where_the_runtime_reads_it(rendered: list[dict[str, Any]]) -> None:
    path = _env(rendered)["LOOMCYCLE_CONFIG_FILES"]
    (config_map,) = [n for n in _objects(rendered, "ConfigMap") if n.startswith("loomcycle-yaml-")]
    (key,) = _objects(rendered, "ConfigMap")[config_map]["data"]
    for workload in _workloads(rendered):
        pod = _pod(workload)
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in _containers(pod):
            mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}
            if workload["metadata"]["name"] == "loomcycle-flower":
                continue  # Flower loads no definitions
            mount = mounts[str(Path(path).parent)]
            assert mount["readOnly"] is True
            assert volumes[mount["name"]]["configMap"]["name"] == config_map
            assert Path(path).name == key


def test_every_container_has_requests_a_memory_limit_and_runs_unprivileged(rendered: list[dict[str, Any]]) -> None:
    for workload in _workloads(rendered):
        pod = _pod(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
        for container in _containers(pod):
            where = (workload["metadata"]["name"], container["name"])
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), where
            assert "memory" in container["resources"]["limits"], where
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
            assert security["readOnlyRootFilesystem"] is True, where
            written = {m["mountPath"] for m in container.get("volumeMounts", []) if not m.get("readOnly")}
            assert {"/tmp", "/app/.loomcycle"} <= written, where  # the data dir and tempfiles: emptyDirs


def _probe_port(container: dict[str, Any], probe: dict[str, Any]) -> int:
    port = next(iter(v for v in probe.values() if isinstance(v, dict)))["port"]
    named = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    return int(named.get(port, port))


def test_web_probes_healthz_on_its_listen_port_and_names_an_allowed_host(rendered: list[dict[str, Any]]) -> None:
    env = _env(rendered)
    web = next(c for c in _pod(_deployment(rendered, "web"))["containers"] if c["name"] == "web")
    port = int(env["LOOMCYCLE_LISTEN_ADDR"].rpartition(":")[2])
    assert web["command"][web["command"].index("-p") + 1] == str(port)
    allowed = [h.strip() for h in env.get("LOOMCYCLE_ALLOWED_HOSTS", "").split(",") if h.strip()]
    for kind in ("readinessProbe", "startupProbe"):
        probe = web[kind]["httpGet"]
        assert probe["path"] == "/healthz" and _probe_port(web, web[kind]) == port
        headers = {h["name"]: h["value"] for h in probe.get("httpHeaders", [])}
        # /healthz checks Host against LOOMCYCLE_ALLOWED_HOSTS (the kubelet sends the pod's IP)
        assert headers.get("Host") == (allowed[0].lstrip(".") if allowed else None), kind
    # Liveness asks no database: a Postgres outage must not restart every web replica.
    assert "tcpSocket" in web["livenessProbe"] and _probe_port(web, web["livenessProbe"]) == port
    (service,) = [s for n, s in _objects(rendered, "Service").items() if n == "loomcycle-web"]
    http = {p["name"]: p for p in service["spec"]["ports"]}["http"]
    assert http["port"] == port and http["targetPort"] == "http"


def test_grpc_is_served_beside_web_exactly_when_configured(rendered: list[dict[str, Any]]) -> None:
    addr = _env(rendered).get("LOOMCYCLE_GRPC_ADDR")
    containers = {c["name"]: c for c in _pod(_deployment(rendered, "web"))["containers"]}
    service_ports = {p["name"]: p for p in _objects(rendered, "Service")["loomcycle-web"]["spec"]["ports"]}
    if addr is None:
        assert set(containers) == {"web"} and set(service_ports) == {"http"}
        return
    port = int(addr.rpartition(":")[2])
    grpc = containers["grpc"]
    assert grpc["command"] == ["python", "manage.py", "grpc"]
    assert grpc["readinessProbe"]["grpc"] == {"port": port, "service": "loomcycle.v1.Loomcycle"}
    assert _probe_port(grpc, grpc["livenessProbe"]) == port
    assert service_ports["grpc"]["port"] == port and service_ports["grpc"]["targetPort"] == "grpc"


def test_the_worker_grace_outlasts_an_iteration_and_its_knobs_are_settings(rendered: list[dict[str, Any]]) -> None:
    from loomcycle_project import env as E

    pod = _pod(_deployment(rendered, "worker"))
    read_timeout_ms = int(_env(rendered).get("LOOMCYCLE_PROVIDER_READ_TIMEOUT_MS", E.PROVIDER_READ_TIMEOUT_MS))
    assert pod["terminationGracePeriodSeconds"] * 1000 > read_timeout_ms  # warm stop: running iterations commit
    assert pod["shareProcessNamespace"] is True  # the pause process reaps a Bash tool's orphans
    (worker,) = pod["containers"]
    command = worker["command"]
    assert command[command.index("--pool") + 1] == "threads"
    assert command[command.index("-c") + 1] == "$(LOOMCYCLE_WORKER_CONCURRENCY)"
    assert int(_env(rendered)["LOOMCYCLE_WORKER_CONCURRENCY"]) >= 1
    assert command[command.index("-Q") + 1] == "runs,maintenance"  # beat's maintenance tasks need a consumer
    assert worker["livenessProbe"]["exec"]["command"][-1] == "worker"


def test_disruption_budgets_select_the_pods_they_guard(rendered: list[dict[str, Any]]) -> None:
    budgets = _objects(rendered, "PodDisruptionBudget")
    assert set(budgets) == {"loomcycle-web", "loomcycle-worker"}
    for name, budget in budgets.items():
        labels = _objects(rendered, "Deployment")[name]["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        assert budget["spec"]["maxUnavailable"] == 1, name
    for service in _objects(rendered, "Service").values():
        selector = service["spec"]["selector"]
        assert any(selector.items() <= _pod_labels(d).items() for d in _objects(rendered, "Deployment").values())


def _pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def test_the_example_agents_component_carries_the_bundled_yaml_and_the_mock() -> None:
    copy = KUBE / "components" / "example-agents" / "loomcycle.yaml"
    assert copy.read_text() == (ROOT / "loomcycle.yaml").read_text(), "copy the repository's loomcycle.yaml again"
    spec = yaml.safe_load((KUBE / "components" / "example-agents" / "kustomization.yaml").read_text())
    env = next(g for g in spec["configMapGenerator"] if g["name"] == "loomcycle-env")
    assert "LOOMCYCLE_MOCK_ENABLED=1" in env["literals"]  # its agents run on the mock provider


def _wait_for_migrations(docs: list[dict[str, Any]]) -> str:
    (init,) = _pod(_deployment(docs, "worker"))["initContainers"]
    assert init["command"][:2] == ["sh", "-c"]
    script: str = init["command"][2]
    return script


def _run_init(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """The init container's script, run here: `python` is this interpreter, the checkout the image's /app."""
    bindir = Path(sys.executable).parent
    env = {**env, "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}"}
    return subprocess.run(["sh", "-c", script], env=env, cwd=ROOT, capture_output=True, timeout=300, check=False)


def _site_yamls() -> dict[str, str]:
    """Every loomcycle.yaml the manifests can mount: the base's, the example agents', the example site's."""
    out = {}
    for directory in (KUBE / "base", KUBE / "overlays" / "example", KUBE / "components" / "example-agents"):
        out[str(directory.relative_to(KUBE))] = (directory / "loomcycle.yaml").read_text()
    return out


def test_the_migration_job_releases_the_pods_that_wait_for_it(stack_env: dict[str, str], tmp_path: Path) -> None:
    """On a database of its own: the init containers' check fails before the Job's command ran
    (a new release's pod waits) and passes once it has (the pod starts); the Job loads each yaml
    the manifests can mount. The suite's own database cannot stand in: its django_migrations
    table lists none applied, so the check fails there."""
    docs = render(KUBE / "base")
    check = re.search(r"until (python manage\.py migrate --check)", _wait_for_migrations(docs))
    assert check, _wait_for_migrations(docs)
    (job,) = _objects(docs, "Job").values()
    boot = " ".join(_pod(job)["containers"][0]["command"])
    name = f"lc_release_{os.getpid()}"
    admin = stack_env["DATABASE_URL"]
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        env = {**stack_env, "DATABASE_URL": admin.replace(f"/{connection.settings_dict['NAME']}?", f"/{name}?")}
        assert env["DATABASE_URL"] != admin
        before = _run_init(check.group(1), env)
        assert before.returncode == 1, (before.stdout + before.stderr).decode()[-2000:]
        for where, text in _site_yamls().items():  # the first run migrates, as the Job of a release does
            (tmp_path / "loomcycle.yaml").write_text(text)
            loaded = _run_init(boot, env | {"LOOMCYCLE_CONFIG_FILES": str(tmp_path / "loomcycle.yaml")})
            assert loaded.returncode == 0, f"{where}: {loaded.stderr.decode()[-2000:]}"
            count = len(yaml.safe_load(text).get("agents") or {})
            assert f"booted: {count} static agent(s)" in loaded.stdout.decode(), (where, loaded.stdout.decode())
        after = _run_init(_wait_for_migrations(docs), env)  # the whole loop: it ends at once
        assert after.returncode == 0 and b"waiting for the migrate Job" not in after.stdout, after.stderr.decode()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_every_exec_probe_names_a_healthcheck_kind() -> None:
    from loomcycle_project.healthcheck import CHECKS

    docs = render(KUBE / "base")
    for deployment in _objects(docs, "Deployment").values():
        for container in _containers(_pod(deployment)):
            for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
                argv = container.get(kind, {}).get("exec", {}).get("command")
                if argv:
                    assert argv[:3] == ["python", "-m", "loomcycle_project.healthcheck"] and argv[3] in CHECKS
