"""Run one lease-checking service in a process whose clock is skewed.

    python -m tests.skewed_clock <offset_seconds> sweep
    python -m tests.skewed_clock <offset_seconds> cancel <agent_id>

Prints the service's result as JSON. The process's wall clock (`time.time`
and Django's `timezone.now`, which reads `datetime.now` and so cannot be
shifted through `time.time`) runs `offset_seconds` ahead of the host's, as a
beat or web host with a wrong clock would. Postgres's clock is untouched.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta


def _skew(offset: float) -> None:
    from django.utils import timezone

    real_time, real_now = time.time, timezone.now
    time.time = lambda: real_time() + offset
    timezone.now = lambda: real_now() + timedelta(seconds=offset)


def main(argv: list[str]) -> object:
    import django

    django.setup()
    _skew(float(argv[0]))
    from apps.core.types import Principal
    from apps.runs import services

    if argv[1] == "sweep":
        return services.run_leases_sweep()
    if argv[1] == "cancel":
        admin = Principal(tenant_id="", subject="skewed", scopes=frozenset({"substrate:admin"}))
        return services.run_cancel(principal=admin, agent_id=argv[2], reason="cancelled by a skewed host")
    raise SystemExit(f"unknown verb {argv[1]!r}")


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
