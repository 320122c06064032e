"""The Celery app. Configuration lives in Django settings (CELERY_ names), read via loomcycle_project.celeryconfig;
the broker transport among them (CELERY_BROKER_TRANSPORT: workers/transport.py by its dotted path, or kombu's own
with LOOMCYCLE_FAST_TRANSPORT=0)."""

from __future__ import annotations

import os

from celery import Celery

from workers.queues import MAINTENANCE, RUNS, TASK_ROUTES

# Process bootstrap, the one environment access here: which settings module a bare
# `celery -A workers.celery` process loads. Every knob after that comes from Django settings.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loomcycle_project.settings")

app = Celery("loomcycle")
app.config_from_object("loomcycle_project.celeryconfig")
app.conf.task_routes = TASK_ROUTES
app.conf.task_default_queue = RUNS
app.conf.task_create_missing_queues = True
app.autodiscover_tasks(
    [
        "apps.runs",
        "apps.gateway",
        "apps.memory",
        "apps.channels",
        "apps.triggers",
        "apps.budgets",
        "apps.lifecycle",
        "apps.a2a",
    ]
)

import workers.signals  # noqa: E402,F401  (connects worker signal handlers)
from loomcycle_project.hardening import not_dumpable  # noqa: E402  (after `app`: the package imports it)

# Every process that loads the app (worker, beat, flower) holds the secrets in its environment.
not_dumpable()

__all__ = ["MAINTENANCE", "RUNS", "app"]
