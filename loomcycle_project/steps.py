"""One first-run step of the Makefile (`make run`, `make test`): announce it, run it with its
output in a log, and on failure say which step failed and why instead of the raw log.

Run with the system python3 as a file (`python3 loomcycle_project/steps.py LABEL -- CMD...`),
before the virtualenv exists: the standard library only, and nothing of the package (its
__init__ imports Celery).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

LOG = Path(".loomcycle") / "setup.log"
TAIL_LINES = 12

# Known causes, as (text in the output, what to do).
HINTS: tuple[tuple[str, str], ...] = (
    ("ensurepip is not", "install the venv module: sudo apt-get install python3-venv  (Debian/Ubuntu)"),
    ("No module named venv", "install the venv module: sudo apt-get install python3-venv  (Debian/Ubuntu)"),
    (
        "No matching distribution found",
        "a requirement has no wheel for this platform or Python: see README.md, Supported platforms",
    ),
    ("Failed building wheel", "a requirement would compile from source here: see README.md, Supported platforms"),
    ("Could not fetch URL", "PyPI is unreachable: check the network or your pip index settings"),
    ("Temporary failure in name resolution", "PyPI is unreachable: check the network or DNS"),
)


def reason(output: str) -> list[str]:
    """The lines that say why: pip's ERROR lines, else the output's last lines."""
    lines = [line for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("ERROR", "Error", "error:"))]
    return errors[-TAIL_LINES:] or lines[-TAIL_LINES:]


def hint(output: str) -> str | None:
    return next((fix for needle, fix in HINTS if needle in output), None)


def run(label: str, argv: list[str]) -> int:
    print(f"==> {label}", flush=True)
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    LOG.parent.mkdir(parents=True, exist_ok=True)
    with LOG.open("a") as log:
        log.write(f"==> {label}\n$ {' '.join(argv)}\n{done.stdout}{done.stderr}\n")
    if done.returncode == 0:
        print(f"    done in {time.monotonic() - started:.0f} s", flush=True)
        return 0
    output = done.stdout + done.stderr
    print(f"FAILED: {label} (exit status {done.returncode})", file=sys.stderr)
    for line in reason(output):
        print(f"    {line}", file=sys.stderr)
    fix = hint(output)
    if fix:
        print(f"fix: {fix}", file=sys.stderr)
    print(f"full output: {LOG}", file=sys.stderr)
    return done.returncode


def main(args: list[str]) -> int:
    if len(args) < 3 or args[1] != "--":
        print("usage: steps.py LABEL -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    return run(args[0], args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
