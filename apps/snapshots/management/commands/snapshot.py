"""`manage.py snapshot export ID FILE` and `manage.py snapshot restore FILE`:
move a snapshot between instances as a file, for envelopes larger than a
request body may be (`LOOMCYCLE_MAX_REQUEST_BYTES`). The same services as
/v1/_snapshots; `restore` refuses a file over `LOOMCYCLE_SNAPSHOT_MAX_BYTES`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.errors import ApplicationError
from apps.core.http import loads_checked
from apps.snapshots import selectors, services


class Command(BaseCommand):
    help = "Export a stored snapshot to a file, or restore one from a file (insert-or-ignore)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        export = sub.add_parser("export", help="write a stored snapshot's envelope to FILE")
        export.add_argument("snapshot_id")
        export.add_argument("file", type=Path)
        restore = sub.add_parser("restore", help="restore the envelope in FILE; prints the counters")
        restore.add_argument("file", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["action"] == "export":
                self._export(options["snapshot_id"], options["file"])
            else:
                self._restore(options["file"])
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc

    def _export(self, snapshot_id: str, file: Path) -> None:
        content = selectors.snapshot_content(snapshot_id=snapshot_id)
        try:
            file.write_text(content, encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"cannot write {file}: {exc.strerror or exc}") from exc
        self.stdout.write(f"wrote {file} ({file.stat().st_size} bytes)")

    def _restore(self, file: Path) -> None:
        """The file parsed as the API parses a body (apps.core.http.loads_checked: bad JSON,
        or text the store cannot keep, is an error with its code), then restored."""
        cap = settings.LOOMCYCLE.snapshot_max_bytes
        try:
            if file.stat().st_size > cap:
                raise CommandError(f"{file} is larger than LOOMCYCLE_SNAPSHOT_MAX_BYTES ({cap})")
            raw = file.read_bytes()
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror or exc}") from exc
        envelope = loads_checked(raw)  # an Invalid becomes a CommandError in handle()
        self.stdout.write(json.dumps(services.snapshot_restore(envelope=envelope), indent=2))
