"""Boot steps shared by `manage.py up` and the test setup: migrate, load yaml (and, on
`boot`, list the tools of the yaml MCP servers not yet discovered)."""

from __future__ import annotations

from typing import Any

from django.core.management import call_command
from django.db import transaction

from apps.core.config import runtime_config
from apps.mcp.services import mcp_static_servers_discover
from apps.memory.seed import memory_entries_seed
from apps.substrate import discovery
from apps.substrate.config import channel_defs_sync_yaml
from apps.substrate.models import AgentDef
from apps.substrate.services import defs_load_yaml
from apps.tools.search_backends import search_config
from apps.tools.volumes import static_volumes


def load_yaml_config(config: dict[str, Any] | None = None) -> list[AgentDef]:
    """Load every yaml block this build reads (definitions of each kind,
    `channels:`, `memory.entries:`; `volumes:` is checked) in one transaction: an invalid entry
    anywhere leaves the database as it was. Returns the static agents.
    `config` is the merged yaml just read; None reads the files again. The Markdown
    agents and skills of LOOMCYCLE_AGENTS_ROOT / _SKILLS_ROOT are layered under it."""
    config = runtime_config(reload=True) if config is None else config
    config = discovery.with_markdown(config, discovery.configured())
    static_volumes(config)  # `volumes:` is read where it is used; a bad entry still stops the boot
    search_config(config)  # `search_providers:` / `search_priority:` likewise (WebSearch reads them)
    with transaction.atomic():
        loaded = defs_load_yaml(config=config)
        channel_defs_sync_yaml(config=config)
        memory_entries_seed(config=config)
    return [row for row in loaded["agent"] if isinstance(row, AgentDef)]


def boot(*, migrate: bool = True, verbosity: int = 0) -> list[AgentDef]:
    """Read the yaml, migrate, load it. Raises the config's ApplicationError
    (the commands print it) before the database is touched."""
    config = runtime_config(reload=True)
    discovery.with_markdown(config, discovery.configured())  # a bad Markdown file stops the boot here too
    if migrate:
        call_command("migrate", interactive=False, verbosity=verbosity)
    agents = load_yaml_config(config)
    mcp_static_servers_discover()  # yaml MCP servers' tools/list; a failure is logged and kept on the cache row
    return agents
