"""`manage.py presets`: the embedded configuration units LOOMCYCLE_PRESETS selects from
(loomcycle's `loomcycle presets`, `presets show <name>` and `env-template`).

    manage.py presets                 the units: name, kind, what each is for
    manage.py presets show NAME       one unit's yaml, as it is layered
    manage.py presets env-template    the non-secret environment variables and their defaults
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core import presets
from apps.core.errors import NotFound


class Command(BaseCommand):
    help = "List the embedded presets and bundles, show one, or print the environment template."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", nargs="?", default="list", choices=["list", "show", "env-template"])
        parser.add_argument("name", nargs="?", help="the unit to show")

    def handle(self, *args: Any, action: str, name: str | None, **options: Any) -> None:
        if action == "env-template":
            self.stdout.write(presets.env_template(), ending="")
        elif action == "show":
            if not name:
                raise CommandError("presets show needs a name (manage.py presets lists them)")
            try:
                self.stdout.write(presets.unit_get(name).text, ending="")
            except NotFound as exc:
                raise CommandError(exc.message) from exc
        else:
            for unit in presets.units_list():
                self.stdout.write(f"{unit.name:<12} {unit.kind:<7} {unit.description}")
