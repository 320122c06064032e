"""`manage.py hash <kind> <name-or-path>`: a definition's content hash
(SPEC 5.3), as loomcycle's `loomcycle hash agent <path>` prints it.

With a path, the hash is computed from the file: a yaml file holding one
definition (its `name:` or the file name names it) or a loomcycle.yaml-style
file with the kind's block, or a `<name>.md` / `SKILL.md` file (frontmatter +
body). The file goes through the same normalisation as boot, so the printed
hash is the `content_sha256` the loaded definition gets. With a name, the hash
of the loaded static (yaml) definition is read from the database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.config import yaml_problem
from apps.core.errors import Invalid
from apps.substrate.config import definition_from_markdown
from apps.substrate.kinds import Kind, Refused, get_kind
from apps.substrate.services import static_row

HASHED_KINDS = ("agent", "skill", "mcpserver")
_FILE_SUFFIXES = (".yaml", ".yml", ".json", ".md")


def _hash(kind: Kind, name: str, raw: Any) -> str:
    if not isinstance(raw, dict):
        raise CommandError(f"{kind.key} {name!r}: the definition must be a mapping")
    try:
        definition = kind.normalise(name, dict(raw), False)
    except Refused as exc:
        raise CommandError(exc.message) from exc
    if kind.content_hash is None:
        raise CommandError(f"{kind.tool} has no content hash")
    return kind.content_hash(name, definition)


def _from_yaml(kind: Kind, path: Path) -> list[tuple[str, Any]]:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise CommandError(f"{path}: invalid yaml: {yaml_problem(exc)}") from exc
    if not isinstance(doc, dict):
        raise CommandError(f"{path}: top level must be a mapping")
    block = doc.get(kind.yaml_key)
    if isinstance(block, dict):  # a loomcycle.yaml-style file: every entry of the kind's block
        if not block:
            raise CommandError(f"{path}: `{kind.yaml_key}:` is empty")
        return [(str(n), raw) for n, raw in block.items()]
    doc = dict(doc)
    return [(str(doc.pop("name", None) or path.stem), doc)]


class Command(BaseCommand):
    help = "Print the content hash (sha256:<hex>) of an agent, skill or MCP server definition."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("kind", choices=HASHED_KINDS)
        parser.add_argument("target", help="a definition file, or the name of a loaded yaml definition")

    def handle(self, *args: Any, **options: Any) -> None:
        kind = get_kind(options["kind"])
        target: str = options["target"]
        path = Path(target)
        if path.is_file():
            entries = self._file_entries(kind, path)
            if len(entries) == 1:
                self.stdout.write(_hash(kind, *entries[0]))
            else:  # several definitions in one file: one `<name> sha256:<hex>` line each
                for name, raw in entries:
                    self.stdout.write(f"{name} {_hash(kind, name, raw)}")
            return
        if target.endswith(_FILE_SUFFIXES):
            raise CommandError(f"file not found: {target}")
        row = static_row(kind, target)
        if row is None:
            raise CommandError(f"no yaml {kind.key} named {target!r} is loaded (see `manage.py boot`) and no such file")
        self.stdout.write(row.content_sha256)

    @staticmethod
    def _file_entries(kind: Kind, path: Path) -> list[tuple[str, Any]]:
        if path.suffix != ".md":
            return _from_yaml(kind, path)
        try:
            return [definition_from_markdown(kind.key, path)]
        except Invalid as exc:
            raise CommandError(exc.message) from exc
