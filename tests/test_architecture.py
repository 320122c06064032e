"""The dependency rules of docs/architecture.md hold (pyproject's
[tool.importlinter] contracts, also run by `make lint`), so CI fails the
commit that makes apps/core import another app or the engine import a tool's app."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
