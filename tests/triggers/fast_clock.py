"""Run Celery with a Django clock that runs fast:

    python -m tests.triggers.fast_clock worker ...   (any `celery -A workers.celery:app` arguments)

`django.utils.timezone.now` returns T0 + (real - T0) x FACTOR, with T0 and
FACTOR from LOOMCYCLE_TEST_CLOCK_T0 (unix seconds) and
LOOMCYCLE_TEST_CLOCK_FACTOR, so every process started with the same pair
agrees on the fast time and a per-minute schedule fires every 60/FACTOR real
seconds. Only the clock differs: the tick, the fire code and the run engine
are the production ones (leases and the lease sweep use Postgres's clock)."""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime


def fast_now(t0: float, factor: float) -> datetime:
    return datetime.fromtimestamp(t0 + (time.time() - t0) * factor, tz=UTC)


def main() -> None:
    from django.utils import timezone

    t0, factor = float(os.environ["LOOMCYCLE_TEST_CLOCK_T0"]), float(os.environ["LOOMCYCLE_TEST_CLOCK_FACTOR"])
    timezone.now = lambda: fast_now(t0, factor)
    from celery.__main__ import main as celery_main

    sys.argv = ["celery", "-A", "workers.celery:app", *sys.argv[1:]]
    celery_main()


if __name__ == "__main__":
    main()
