"""The gateway's one hook into its caller's scheduling: `outside()` marks a
section in which the calling thread waits on the outside world (the mock's
simulated latency, a provider-slot wait), so that whoever schedules that
thread may run other work meanwhile.

The gateway knows nothing of who that is. The runs app installs the engine's
admission (`apps.runs.engine.admission.ADMISSION.outside`) at AppConfig.ready; until
something is installed, and in processes that install nothing, `outside()` is
a no-op. Remote provider calls are marked by the engine itself (their
`Capabilities.remote`), not here.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

OutsideHook = Callable[[], AbstractContextManager[None]]

_hook: OutsideHook = nullcontext


def install(hook: OutsideHook) -> None:
    """Set the hook (once, at AppConfig.ready: it is read without a lock)."""
    global _hook
    _hook = hook


def outside() -> AbstractContextManager[None]:
    """Enter for the duration of a wait on the outside world."""
    return _hook()
