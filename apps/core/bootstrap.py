"""Boot steps shared by `manage.py up` and the test setup: migrate, load yaml."""

from __future__ import annotations

from django.conf import settings
from django.core.management import call_command

from apps.substrate.config import default_config_paths, load_config
from apps.substrate.models import AgentDef
from apps.substrate.services import defs_load_yaml


def load_yaml_config() -> list[AgentDef]:
    paths = default_config_paths(settings.BASE_DIR, list(settings.LOOMCYCLE.config_files))
    loaded = defs_load_yaml(config=load_config(paths) if paths else {})
    return [row for row in loaded["agent"] if isinstance(row, AgentDef)]


def boot(*, migrate: bool = True, verbosity: int = 0) -> list[AgentDef]:
    if migrate:
        call_command("migrate", interactive=False, verbosity=verbosity)
    return load_yaml_config()
