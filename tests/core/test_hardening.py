"""Every process `manage.py up` starts is non-dumpable (loomcycle_project.hardening): each
entry point, imported in a fresh (dumpable) interpreter, leaves it non-dumpable: the web's ASGI
module (Daphne), the Celery app (worker, beat, flower) and manage.py's (`up`, the supervisor).
Any import of the package does it (loomcycle_project imports the Celery app first)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.procs import ROOT

PROBE = """
import ctypes, importlib, os
def dumpable(): return ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
assert dumpable() == 1, "a fresh interpreter starts dumpable"
importlib.import_module(os.environ["LC_ENTRY"])  # not argv: Django's setup reads it
print("dumpable" if dumpable() else "not dumpable")
"""


@pytest.mark.parametrize(
    "entry",
    ["loomcycle_project.asgi", "workers.celery", "loomcycle_project.cli"],  # cli: manage.py (up)
)
def test_each_process_up_starts_makes_itself_non_dumpable(entry: str) -> None:
    keep = ("PATH", "LOOMCYCLE_DATA_DIR", "DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "LOOMCYCLE_CONFIG_FILES")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.update(DJANGO_SETTINGS_MODULE="loomcycle_project.settings", PYTHONPATH=str(ROOT), LC_ENTRY=entry)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "not dumpable", out.stderr[-2000:]
