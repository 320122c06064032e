"""Snapshots (SPEC 2.4, 4.6): capture the runtime's state into a versioned,
checksummed envelope, store and export it, restore it here or on another
instance. This app owns only the stored envelopes; every other app exports
and restores its own tables (`apps/<app>/snapshot.py`), coordinated by
apps.snapshots.services."""

from django.apps import AppConfig


class SnapshotsConfig(AppConfig):
    name = "apps.snapshots"
    label = "snapshots"
    default_auto_field = "django.db.models.BigAutoField"
