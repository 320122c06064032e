"""The client-only distribution (loomcycle/pyproject.toml): it installs into a fresh venv
without the runtime, gives the `loomcycle` command, and imports without Django; its pins
are the runtime's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.procs import ROOT

CLIENT = ROOT / "loomcycle"


def _pins(lines: list[str]) -> dict[str, str]:
    found = {}
    for line in lines:
        match = re.match(r"^([A-Za-z0-9_.\[\]-]+)==([^\s;#]+)", line.strip())
        if match:
            found[re.sub(r"\[.*\]", "", match[1]).lower()] = match[2]
    return found


def test_the_client_pins_are_the_runtimes() -> None:
    client = _pins(tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]["dependencies"])
    runtime = _pins((ROOT / "requirements" / "base.txt").read_text().splitlines())
    assert set(client) == {"httpx", "httpx-sse", "click", "rich", "pyyaml"}
    assert {name: runtime.get(name) for name in client} == client


def _run(*argv: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_client_installs_alone_and_imports_without_django(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: the build writes its egg-info beside the sources
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", source)
    assert "Usage: loomcycle" in _run(venv / "bin" / "loomcycle", "--help", cwd=tmp_path)
    check = "import loomcycle.client, loomcycle.cli, sys; assert 'django' not in sys.modules, 'django imported'"
    _run(venv / "bin" / "python", "-c", check, cwd=tmp_path)
    installed = _run(venv / "bin" / "python", "-m", "pip", "list", "--format=freeze").lower()
    assert "django" not in installed and "celery" not in installed
