"""Celery's configuration: the CELERY_* Django settings, copied once into plain
module attributes when Celery first reads its config.

`config_from_object("django.conf:settings", namespace="CELERY")` would keep
Django's LazySettings as a live source, and Celery reads its config dozens of
times per task and per publish; each read would go through
LazySettings.__getattr__. Django settings remain the one source of truth.
"""

from __future__ import annotations

from django.conf import settings

_PREFIX = "CELERY_"

for _name in dir(settings):
    if _name.startswith(_PREFIX):
        globals()[_name[len(_PREFIX) :].lower()] = getattr(settings, _name)
