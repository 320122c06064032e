"""`manage.py doctor` on the machine itself: an unsupported platform or CPython, a python3 that
cannot create a virtualenv (Debian's python3 without python3-venv), a port in use, each reported
with the command that fixes it (loomcycle_project.platformcheck)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from loomcycle_project.platformcheck import check_platform, check_venv_module


def test_the_supported_platforms_pass_and_others_fail_with_what_to_do() -> None:
    for system, machine in (("Linux", "x86_64"), ("Linux", "aarch64"), ("Darwin", "arm64"), ("Linux", "arm64")):
        assert check_platform(system, machine, (3, 12), macos="15.1")[0][0] == "PASS", (system, machine)
    old_mac = check_platform("Darwin", "arm64", (3, 12), macos="14.6")[0]
    assert old_mac[0] == "FAIL" and "macOS 14.6 is older than 15" in old_mac[2]
    (level, name, detail), python = check_platform("Windows", "AMD64", (3, 10))
    assert (level, name) == ("FAIL", "platform") and "set DATABASE_URL and REDIS_URL" in detail
    assert python[0] == "FAIL" and "uv python install 3.12" in python[2]
    assert check_platform("Linux", "x86_64", (3, 13))[1] == ("PASS", "python", "CPython 3.13")


def test_a_python_without_ensurepip_is_reported_with_the_apt_command(tmp_path: Path) -> None:
    # Debian's and Ubuntu's python3 without python3-venv: `ensurepip` exists but refuses to import.
    (tmp_path / "ensurepip.py").write_text("raise ImportError('ensurepip is disabled in Debian/Ubuntu')\n")
    level, name, detail = check_venv_module(sys.executable, env={"PYTHONPATH": str(tmp_path)})[0]
    assert name == "venv" and level in ("FAIL", "WARN")
    assert detail.endswith("sudo apt-get install python3-venv  (Debian/Ubuntu)")
    assert check_venv_module(sys.executable)[0][0] == "PASS"


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def test_doctor_names_a_port_in_use_and_how_to_free_or_move_it(
    capsys: pytest.CaptureFixture[str], db: None, settings: object, held_port: int
) -> None:
    import dataclasses

    addr = f"127.0.0.1:{held_port}"
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, listen_addr=addr)  # type: ignore[attr-defined]
    call_command("doctor")
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if " listen: " in line)
    assert line.startswith("WARN") and f"{addr} is in use" in line
    assert (
        f"lsof -nP -iTCP:{held_port} -sTCP:LISTEN" in line
        and f"LOOMCYCLE_LISTEN_ADDR=127.0.0.1:{held_port + 1}" in line
    )
    assert "PASS platform" in out and "PASS python" in out and "PASS redis server" in out
