"""The client-only distribution (loomcycle_http/pyproject.toml): it installs into a fresh venv
without the runtime (offline: no index, no build isolation), gives the `loomcycle` command,
and imports without Django; with its `testing` extra, pytest loads the testing kit by its entry
point; its ranges hold the runtime's pins; the runtime's distribution ships none of it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement  # (pytest's own dependency)

from tests.procs import ROOT

CLIENT = ROOT / "loomcycle_http"


def _pins(lines: list[str]) -> dict[str, str]:
    found = {}
    for line in lines:
        match = re.match(r"^([A-Za-z0-9_.\[\]-]+)==([^\s;#]+)", line.strip())
        if match:
            found[re.sub(r"\[.*\]", "", match[1]).lower()] = match[2]
    return found


def _project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]
    return project


def test_the_client_takes_compatible_ranges_that_hold_the_runtimes_pins_and_the_cli_is_an_extra() -> None:
    project = _project()
    library = [Requirement(line) for line in project["dependencies"]]
    cli = [Requirement(line) for line in project["optional-dependencies"]["cli"]]
    testing = [Requirement(line) for line in project["optional-dependencies"]["testing"]]
    assert {r.name.lower() for r in library} == {"httpx", "httpx-sse"}
    assert {r.name.lower() for r in cli} == {"click", "rich", "pyyaml"}
    assert {r.name.lower() for r in testing} == {"pytest"}
    requirements = ROOT / "requirements"
    runtime = _pins(
        [*(requirements / "base.txt").read_text().splitlines(), *(requirements / "dev.txt").read_text().splitlines()]
    )
    for req in library + cli + testing:
        assert not any(spec.operator == "==" for spec in req.specifier), req  # a range, never a pin
        assert "<" in str(req.specifier), req  # bounded above: the next major may break us
        assert req.specifier.contains(runtime[req.name.lower()]), (req, runtime[req.name.lower()])


def _run(*argv: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done.stdout


def _closure(names: list[str]) -> list[metadata.Distribution]:
    """The installed distributions `names` need, transitively (their unconditional requirements)."""
    seen: dict[str, metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen[name] = dist = metadata.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):  # not an extra; this Python's
                todo.append(req.name)
    return list(seen.values())


def _copy_installed(dists: list[metadata.Distribution], site: Path) -> None:
    """Copy each distribution's files (its record) from this venv into `site`: offline, no resolution."""
    for dist in dists:
        for file in dist.files or []:
            src = Path(str(dist.locate_file(file)))
            if src.is_file() and not str(file).startswith(".."):  # scripts live outside site-packages
                dst = site / file
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)


def test_the_client_installs_alone_and_imports_without_django(tmp_path: Path) -> None:
    """Offline: the wheel is built here without build isolation, installed without an index, and its
    dependencies are copied from this venv; `pip check` then proves they satisfy the wheel's pins."""
    source = tmp_path / "src"  # a copy: the build writes its egg-info beside the sources
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    wheels = tmp_path / "wheels"
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run(*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "-w", wheels, source)
    (wheel,) = wheels.glob("loomcycle_http-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    vpip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    _run(*vpip, "install", "--quiet", "--no-deps", "--no-index", wheel)
    site = Path(_run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    names = [Requirement(line).name for line in _project()["dependencies"]]
    _copy_installed(_closure(names), site)
    _run(*vpip, "check")
    alone = subprocess.run([venv / "bin" / "loomcycle", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert alone.returncode == 1 and "pip install 'loomcycle-http[cli]'" in alone.stderr  # the library alone
    _run(venv / "bin" / "python", "-c", "import loomcycle_http.client", cwd=tmp_path)
    _copy_installed(_closure([Requirement(line).name for line in _project()["optional-dependencies"]["cli"]]), site)
    _run(*vpip, "check")
    assert "Usage: loomcycle" in _run(venv / "bin" / "loomcycle", "--help", cwd=tmp_path)
    check = "import loomcycle_http.client, loomcycle_http.cli, sys; assert 'django' not in sys.modules, 'django'"
    _run(venv / "bin" / "python", "-c", check, cwd=tmp_path)
    _the_testing_extra_loads_the_kit(venv, site, tmp_path)
    installed = _run(*vpip, "list", "--format=freeze").lower()
    assert "django" not in installed and "celery" not in installed


def _the_testing_extra_loads_the_kit(venv: Path, site: Path, cwd: Path) -> None:
    """Without pytest the kit does not import; with the `testing` extra's requirements, pytest
    loads it by its pytest11 entry point (no `-p`), named as the module, and nothing of Django."""
    python = venv / "bin" / "python"
    assert subprocess.run([python, "-c", "import loomcycle_http.testing"], capture_output=True, cwd=cwd).returncode
    _copy_installed(_closure([Requirement(line).name for line in _project()["optional-dependencies"]["testing"]]), site)
    _run(python, "-m", "pip", "--disable-pip-version-check", "check")
    names = "from importlib import metadata; print(*[e.name for e in metadata.entry_points(group='pytest11')])"
    assert _run(python, "-c", names, cwd=cwd).split().count("loomcycle_http.testing") == 1  # (anyio has one too)
    assert "--loomcycle-url" in _run(python, "-m", "pytest", "-p", "no:cacheprovider", "--help", cwd=cwd)
    both = "-p loomcycle_http.testing"  # the entry point and `-p` register it once (one name)
    assert "--loomcycle-url" in _run(python, "-m", "pytest", *both.split(), "-p", "no:cacheprovider", "--help", cwd=cwd)
    check = "import loomcycle_http.testing, sys; assert not {'django', 'celery'} & set(sys.modules), 'django'"
    _run(python, "-c", check, cwd=cwd)


def test_the_runtime_distribution_ships_neither_the_client_nor_its_command() -> None:
    """The two distributions never install the same files: the runtime's leaves `loomcycle` to the client's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "loomcycle" not in project["project"].get("scripts", {})
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert not [pattern for pattern in include if pattern.startswith("loomcycle") and "_" not in pattern]


def _wheel(source: Path, into: Path) -> Path:
    pip: list[str | Path] = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run(*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index", "-w", into, source)
    (wheel,) = into.glob("*.whl")
    return wheel


def _record(venv: Path, distribution: str) -> set[str]:
    """The files `distribution` installed into `venv`, its metadata folder aside."""
    code = f"from importlib import metadata; print('\\n'.join(str(f) for f in metadata.files({distribution!r})))"
    files = _run(venv / "bin" / "python", "-c", code).split()
    return {name for name in files if ".dist-info/" not in name}


def test_the_official_loomcycle_client_installs_beside_this_projects_client_and_runtime(tmp_path: Path) -> None:
    """PyPI's `loomcycle` (loomcycle's own gRPC client, pinned in requirements/dev.txt) and this
    project's two distributions share no installed file, so installing one never overwrites the
    other, and both clients import from one environment (docs/client.md, "Names")."""
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", venv)
    site = Path(_run(venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))").strip())
    _copy_installed(_closure(["loomcycle"]), site)  # the official client as pip installed it here, offline
    client = shutil.copytree(CLIENT, tmp_path / "client", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    junk = (".venv", ".git", ".loomcycle", "tests", "node_modules", "build", "*.egg-info", "__pycache__", ".*_cache")
    runtime = shutil.copytree(ROOT, tmp_path / "runtime", ignore=shutil.ignore_patterns(*junk))
    vpip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check"]
    for source in (client, runtime):
        _run(*vpip, "install", "--quiet", "--no-deps", "--no-index", _wheel(source, tmp_path / f"{source.name}-wheel"))
    names = ("loomcycle", "loomcycle-http", "loomcycle-django")
    official, ours, runtime_files = (_record(venv, name) for name in names)
    assert "loomcycle/client.py" in official and "loomcycle_http/client/sync.py" in ours
    assert not official & ours and not official & runtime_files and not ours & runtime_files
    _copy_installed(_closure(["httpx", "httpx-sse", "click", "rich", "pyyaml"]), site)
    both = "import loomcycle as lc, loomcycle_http.client as o; print(lc.LoomcycleClient.__module__, o.Client.__name__)"
    assert _run(venv / "bin" / "python", "-c", both, cwd=tmp_path).split() == ["loomcycle.client", "Client"]
