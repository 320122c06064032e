"""`manage.py boot`: migrate and load loomcycle.yaml, then exit (compose's migrate step)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from apps.core.errors import ApplicationError
from loomcycle_project.bootstrap import boot


class Command(BaseCommand):
    help = "Apply migrations and load the yaml definitions, then exit."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            agents = boot(migrate=True, verbosity=int(options["verbosity"]))
        except ApplicationError as exc:  # a config error: its message, not a traceback
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        self.stdout.write(f"booted: {len(agents)} static agent(s): {', '.join(sorted(a.name for a in agents))}")
