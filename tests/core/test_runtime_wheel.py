"""The runtime's wheel ships every file its apps read at run time that is not Python: templates,
static assets (the console's, served by WhiteNoise), the Context help topics and the embedded
configuration units. Built offline from a copy of this checkout (the build leaves its `build/` and
egg-info behind), as `pip install .` would build it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.procs import ROOT

DATA = ("templates", "static")
SOURCES = ("pyproject.toml", "README.md", "requirements", "apps", "loomcycle_project", "workers")


def _data_files() -> set[str]:
    found = set()
    for path in (ROOT / "apps").rglob("*"):
        parts = path.relative_to(ROOT).parts
        if not path.is_file() or "__pycache__" in parts or path.suffix == ".py":
            continue
        if any(d in parts for d in DATA) or parts[1:3] == ("runs", "help") or parts[1:3] == ("core", "presets"):
            found.add("/".join(parts))
    return found


def test_the_wheel_holds_every_template_static_file_help_topic_and_preset(tmp_path: Path) -> None:
    wanted = _data_files()
    assert any("/console/" in f for f in wanted) and any(f.endswith(".yaml") for f in wanted)
    tree = tmp_path / "src"
    tree.mkdir()
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, tree / name)
    wheel_cmd = ["pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path), "."]
    done = subprocess.run(
        [sys.executable, "-m", *wheel_cmd], cwd=tree, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = tmp_path.glob("*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(wanted - shipped) == []
    # The testing kit and its pytest11 entry point are the client distribution's (loomcycle_http/testing).
    assert not [name for name in shipped if name.startswith(("loomcycle_testing/", "loomcycle_http/"))]
    entry_points = [name for name in shipped if name.endswith(".dist-info/entry_points.txt")]
    assert not any("pytest11" in zipfile.ZipFile(wheel).read(name).decode() for name in entry_points)
