"""`manage.py doctor`: PASS/WARN/FAIL lines for what the runtime needs; exit 1 on any FAIL."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import DatabaseError, connection
from redis import RedisError

from apps.core.errors import ApplicationError
from apps.core.redis import sync_client
from apps.gateway.providers import provider_ids
from loomcycle_project import env as E
from loomcycle_project.management.commands.up import port_free, split_addr
from loomcycle_project.platformcheck import check_embedded_redis, check_platform, check_venv_module, port_fix

Check = tuple[str, str, str]  # (PASS|WARN|FAIL, name, detail)


def check_config() -> list[Check]:
    """The layers load as boot loads them (LOOMCYCLE_PRESETS, _CONFIG_DIR, _FILES, _STRICT);
    an unknown preset, a missing file or directory, bad yaml or a strict-mode conflict is a
    FAIL naming it."""
    from apps.core.config import configured_paths, configured_units, load_config

    try:
        paths, units = configured_paths(), configured_units()
        if not paths and not units:
            return [("WARN", "config", "no loomcycle.yaml found and no LOOMCYCLE_PRESETS; no static agents")]
        loaded = load_config(paths, strict=settings.LOOMCYCLE.config_strict, units=units)
        layers = [u.label for u in units] + [str(p) for p in paths]
        return [("PASS", "config", f"{', '.join(layers)}: {len(loaded.get('agents') or {})} agent(s)")]
    except ApplicationError as exc:
        return [("FAIL", "config", f"{exc.code}: {exc.message}")]


def check_markdown() -> list[Check]:
    """The Markdown agents and skills boot loads (LOOMCYCLE_AGENTS_ROOT, _SKILLS_ROOT), by name;
    a missing root or a bad file is a FAIL naming it (and the line)."""
    from apps.core.config import runtime_config
    from apps.substrate import discovery

    cfg = settings.LOOMCYCLE
    if not cfg.agents_root and not cfg.skills_root:
        return []
    try:
        found = discovery.configured()
        discovery.with_markdown(runtime_config(reload=True), found)
    except ApplicationError as exc:
        return [("FAIL", "markdown defs", f"{exc.code}: {exc.message}")]
    return [("PASS", "markdown defs", discovery.summary(found))]


def check_postgres() -> list[Check]:
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT version()")
            version = str(cur.fetchone()[0]).split(" on ")[0]
            cur.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'")
            vec = cur.fetchone()
    except DatabaseError as exc:
        return [("FAIL", "postgres", f"not reachable: {exc}")]
    out: list[Check] = [("PASS", "postgres", version)]
    if vec:
        out.append(("PASS", "pgvector", f"available ({vec[0]})"))
    else:
        out.append(("FAIL", "pgvector", "extension not available"))
    return out


def check_redis() -> list[Check]:
    from loomcycle_project.embedded import embedded_redis_alive, embedded_redis_url

    if settings.REDIS_URL == embedded_redis_url(E.DATA_DIR) and not embedded_redis_alive(E.DATA_DIR):
        return [("WARN", "redis", "embedded Redis is not running yet (`make run` starts it)")]
    try:
        info = sync_client().info("server")
        return [("PASS", "redis", f"redis {info['redis_version']}")]
    except (RedisError, OSError) as exc:
        return [("FAIL", "redis", f"not reachable: {exc}")]


def check_listen() -> list[Check]:
    """The ports `up` binds: the API, and Flower when it runs; in use means already running, or another program."""
    ports = [(settings.LOOMCYCLE.listen_addr, "listen", "LOOMCYCLE_LISTEN_ADDR")]
    if E.FLOWER_ENABLED:
        ports.append((f"{E.FLOWER_ADDRESS}:{E.FLOWER_PORT}", "flower", "LOOMCYCLE_FLOWER_PORT"))
    out: list[Check] = []
    for addr, name, variable in ports:
        host, port = split_addr(addr)
        if port_free(host, port):
            out.append(("PASS", name, f"{host}:{port} is free"))
        else:
            fix = port_fix(host, port, variable) if name == "listen" else f"set {variable}={port + 1}"
            out.append(
                ("WARN", name, f"{host}:{port} is in use (loomcycle already running, or another program): {fix}")
            )
    return out


def check_auth() -> list[Check]:
    from django.utils import timezone

    from apps.substrate.openmode import public_host_configured
    from apps.substrate.tokens import ADMIN_SCOPE, valid_tokens

    cfg = settings.LOOMCYCLE
    try:
        now = timezone.now()
        live = valid_tokens(now).count()
        admins = valid_tokens(now).filter(scopes__contains=[ADMIN_SCOPE]).count()
    except DatabaseError as exc:
        return [("FAIL", "auth", f"cannot read operator tokens: {exc}")]
    out: list[Check] = [("PASS", "auth tokens", f"{live} live operator token(s), {admins} with substrate:admin")]
    if cfg.auth_token and admins:
        out.append(("WARN", "auth legacy", "LOOMCYCLE_AUTH_TOKEN is set but disabled by an admin token; unset it"))
    elif cfg.auth_token:
        out.append(("PASS", "auth legacy", "LOOMCYCLE_AUTH_TOKEN is active (until the first admin token is minted)"))
    elif not live and not public_host_configured():
        out.append(("WARN", "auth", "open mode: no LOOMCYCLE_AUTH_TOKEN and no token; loopback clients only"))
    elif not admins:
        detail = (
            "tokens exist but no admin credential does: nobody can administer the runtime over the API"
            if live
            else "LOOMCYCLE_ALLOWED_HOSTS names a public host, so open mode is off, and no token exists: "
            "every request is a 401"
        )
        out.append(("WARN", "auth admin", f"{detail}; mint one (`manage.py token create --name admin --tenant ops`)"))
    if not cfg.operator_token_pepper:
        detail = "LOOMCYCLE_OPERATOR_TOKEN_PEPPER is empty: a leaked database alone lets token hashes be checked"
        out.append(("WARN", "auth pepper", detail))
    out.append(check_audit_log(cfg.audit_log_path))
    return out


def check_audit_log(path: str) -> Check:
    from pathlib import Path

    target = Path(path)
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent  # the file, else the first existing ancestor that would create it
    if os.access(probe, os.W_OK):
        return ("PASS", "audit log", str(target))
    return ("FAIL", "audit log", f"{target} is not writable: token create/rotate/retire will fail")


_SOURCES = {"env": "from the environment", "file": "generated in {path}", "none": "not set"}


def check_secrets() -> list[Check]:
    """Where SECRET_KEY and the token pepper come from; a deployment on external
    servers should set both itself (each machine would generate its own)."""
    from loomcycle_project import instance_secrets

    path = instance_secrets.path(E.DATA_DIR)
    out: list[Check] = []
    for name, source in (
        ("secret key", settings.SECRET_KEY_SOURCE),
        ("token pepper", settings.OPERATOR_TOKEN_PEPPER_SOURCE),
    ):
        detail = _SOURCES[source].format(path=path)
        if source == "none":
            out.append(("WARN", name, f"{detail}: set it, or start with `make run` on the embedded default"))
        elif source == "file" and not E.embedded_default():
            out.append(("WARN", name, f"{detail}; on external servers set it in the environment of every machine"))
        else:
            out.append(("PASS", name, detail))
    return out


def check_mock() -> list[Check]:
    enabled, why = E.mock_enabled()
    state = "enabled" if enabled else "disabled"
    level = "WARN" if enabled and why == "LOOMCYCLE_MOCK_ENABLED" and not E.embedded_default() else "PASS"
    return [(level, "mock provider", f"{state} ({why})")]


def check_providers() -> list[Check]:
    """Configured providers (a config error is a FAIL) and which keys are set."""
    try:
        ids = provider_ids()
    except ApplicationError as exc:
        return [("FAIL", "providers", exc.message)]
    out: list[Check] = [("PASS", "providers", f"configured: {', '.join(ids) or 'none'}")]
    keys = [k for k, v in E.PROVIDER_KEYS.items() if v]
    real = [p for p in ids if not p.startswith("mock") and p != "ollama-local"]
    if keys:
        out.append(("PASS", "provider keys", f"{', '.join(keys)} set"))
    elif not real:
        out.append(("WARN", "provider keys", "none set; only the mock and a local Ollama are usable"))
    return out


def check_tools() -> list[Check]:
    """The SPEC 8 posture the settings add up to, and what each built-in tool may do."""
    from apps.core import toolregistry
    from apps.tools.posture import posture, stances

    floor = list(settings.LOOMCYCLE.tools_enabled)
    try:  # the file tools' stances read yaml `volumes:`; a broken config is check_config's FAIL
        described = {s.tool: s.allows for s in stances()}
        current = posture().value
    except ApplicationError as exc:
        return [("FAIL", "posture", f"cannot tell: {exc.message}")]
    out: list[Check] = [("PASS", "posture", f"{current} (docs/tools.md#policy-and-postures)")]
    for name in toolregistry.names():
        if not toolregistry.allowed(floor, name):
            out.append(("PASS", f"tool {name}", "off: not in LOOMCYCLE_TOOLS_ENABLED"))
            continue
        detail = described.get(name, "for agents that list it in tools:, within its own ACLs")
        out.append(("PASS", f"tool {name}", detail))
    return out


def check_bash() -> list[Check]:
    """Bash's sandbox, when Bash is on: FAIL when bubblewrap cannot run (every call is refused), WARN unsandboxed."""
    from apps.tools import sandbox

    conf = settings.LOOMCYCLE
    if not conf.bash_enabled:
        return []
    problem = sandbox.operator_warning()
    if problem is None:
        return [("PASS", "bash sandbox", f"bubblewrap ({conf.bash_bwrap}) runs each command")]
    return [("WARN" if conf.bash_unsandboxed else "FAIL", "bash sandbox", problem)]


def check_embedded() -> list[Check]:
    """The embedded Redis-compatible server, when REDIS_URL is the embedded default."""
    from loomcycle_project.embedded import embedded_redis_url

    return check_embedded_redis() if settings.REDIS_URL == embedded_redis_url(E.DATA_DIR) else []


CHECKS: list[Callable[[], list[Check]]] = [
    check_platform,
    check_venv_module,
    check_embedded,
    check_config,
    check_markdown,
    check_postgres,
    check_redis,
    check_listen,
    check_auth,
    check_secrets,
    check_providers,
    check_mock,
    check_tools,
    check_bash,
]


class Command(BaseCommand):
    help = "Check configuration, Postgres (+pgvector), Redis, the listen port, auth and providers."

    def handle(self, *args: Any, **options: Any) -> None:
        failed = False
        for check in CHECKS:
            for level, name, detail in check():
                style = {"PASS": self.style.SUCCESS, "WARN": self.style.WARNING, "FAIL": self.style.ERROR}[level]
                self.stdout.write(f"{style(level):<4} {name}: {detail}")
                failed |= level == "FAIL"
        connection.close()
        if failed:
            raise SystemExit(1)
