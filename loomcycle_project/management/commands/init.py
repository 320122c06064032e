"""`manage.py init [--force] [--with-token]`: a starter loomcycle.yaml in the
current directory; with --with-token also an admin bearer token, written to
`.loomcycle.env` (mode 0600) and nowhere else."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.errors import ApplicationError
from apps.substrate import tokens
from apps.substrate.kinds import Refused

CONFIG_NAME = "loomcycle.yaml"
ENV_NAME = ".loomcycle.env"
STARTER_YAML = """\
# loomcycle.yaml, written by `manage.py init`. Agents here run on the mock
# provider, so this works with no API key. See docs/configuration.md.
agents:
  hello:
    description: A starter agent on the mock provider; answers "ok".
    provider: mock
    model: mock-generic
    system_prompt: You are a helpful assistant.
    tools: []
"""


class Command(BaseCommand):
    help = "Write a starter loomcycle.yaml here; --with-token also mints an admin token into .loomcycle.env."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--force", action="store_true", help="overwrite existing files")
        parser.add_argument("--with-token", action="store_true", help=f"mint an admin token into {ENV_NAME} (0600)")
        parser.add_argument("--token-name", default="admin", help="name of the minted token (default: admin)")
        parser.add_argument("--tenant", default="default", help="tenant of the minted token (default: default)")

    def handle(self, *args: Any, **options: Any) -> None:
        cwd = Path.cwd()
        config, env_file = cwd / CONFIG_NAME, cwd / ENV_NAME
        targets = [config, env_file] if options["with_token"] else [config]
        existing = [p.name for p in targets if p.exists()]
        if existing and not options["force"]:
            raise CommandError(f"{', '.join(existing)} already exist(s) in {cwd}; use --force to overwrite")
        if options["with_token"]:
            self._mint_into(env_file, options)
        config.write_text(STARTER_YAML)
        self.stdout.write(f"wrote {config} (agent 'hello' on the mock provider)")
        if cwd.resolve() != Path(settings.BASE_DIR).resolve():
            self.stdout.write(f"the server reads it with LOOMCYCLE_CONFIG_FILES={config}")

    def _mint_into(self, env_file: Path, options: dict[str, Any]) -> None:
        # Written to a 0600 temp file first (an unwritable directory fails before a
        # token exists), moved into place only once it holds the token.
        tmp = env_file.with_name(env_file.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a leftover temp file keeps its old mode otherwise
        try:
            with os.fdopen(fd, "w") as fh:
                out = tokens.token_create(name=options["token_name"], tenant_id=options["tenant"], by="cli:init")
                fh.write(f"LOOMCYCLE_TOKEN={out['token']}\n")
            os.replace(tmp, env_file)
        except (Refused, ApplicationError) as exc:
            hint = " (rotate it: `manage.py token rotate --name ...`)" if "use rotate" in exc.message else ""
            raise CommandError(f"cannot mint the token: {exc.message}{hint}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        listen = settings.LOOMCYCLE.listen_addr
        self.stdout.write(
            f"minted admin token {out['name']!r} ({out['def_id']}, tenant {out['tenant_id']}) into {env_file}"
        )
        self.stdout.write("it is stored nowhere else (mode 0600). The first admin token turns off open mode and")
        self.stdout.write("LOOMCYCLE_AUTH_TOKEN. Use it:")
        self.stdout.write(f"  set -a; . {env_file}; set +a")
        self.stdout.write(f'  curl -H "Authorization: Bearer $LOOMCYCLE_TOKEN" http://{listen}/v1/_me')
