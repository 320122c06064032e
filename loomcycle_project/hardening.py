"""Process hardening shared by every process `manage.py up` starts (and compose runs).

`not_dumpable`: prctl(PR_SET_DUMPABLE, 0). /proc/<pid>/environ, /proc/<pid>/mem and ptrace
of the process become root-only, so nothing else running as the same user (a Bash command
run unsandboxed, a stray tool) reads its environment back: DATABASE_URL, provider keys,
SECRET_KEY, LOOMCYCLE_TOKEN. Called where each process starts: the supervisor (`up`), the
web process (loomcycle_project.asgi), and every process that loads the Celery app (worker,
beat, flower: workers.celery). It does nothing against root (CAP_SYS_PTRACE), is reset by
exec (so each process sets it itself), and is inherited by forked children.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger("loomcycle.hardening")

PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4


def not_dumpable() -> bool:
    """Make this process non-dumpable; False where it is not available (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: errno %d", ctypes.get_errno())
        return False
    return True


def is_dumpable() -> bool:
    """Whether this process is dumpable now (True where it cannot tell: not Linux)."""
    if not sys.platform.startswith("linux"):
        return True
    return bool(ctypes.CDLL(None).prctl(PR_GET_DUMPABLE, 0, 0, 0, 0))
