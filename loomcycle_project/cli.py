"""The management command line (`manage.py`, `python -m loomcycle_project`).
With no DATABASE_URL / REDIS_URL, the embedded Postgres and Redis under
LOOMCYCLE_DATA_DIR are started (or joined) first, so every command works on
a fresh machine. It lives in the package (not only in the repository's
manage.py) so that an installed runtime has it too."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "loomcycle_project.settings")
    from loomcycle_project import env as E
    from loomcycle_project import instance_secrets
    from loomcycle_project.embedded import EmbeddedUnavailable, ensure_services

    if not os.environ.get("DATABASE_URL"):
        # The embedded default: this data directory is the deployment, so its
        # SECRET_KEY and token pepper are generated here once (before settings load).
        instance_secrets.ensure(E.DATA_DIR)
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        # Only `up` starts (and later stops) the embedded Redis; other commands use it if it runs.
        try:
            ensure_services(E.DATA_DIR, start_redis_server=sys.argv[1:2] == ["up"])
        except EmbeddedUnavailable as exc:  # a production install without DATABASE_URL/REDIS_URL: say which
            sys.exit(f"loomcycle: {exc}")
        except (RuntimeError, OSError) as exc:  # a server that would not start: the step and why, not a traceback
            sys.exit(f"loomcycle: {exc}")
    from django.core.management import execute_from_command_line

    if sys.argv[1:2] == ["mcp"]:  # it creates runs in this process: their root spans are made here
        from loomcycle_project import telemetry

        telemetry.setup("mcp")
    execute_from_command_line(sys.argv)
