"""`manage.py token create|list|rotate|revoke`: operator bearer tokens from the CLI.

The plaintext is printed once by create and rotate and never stored; `list`
prints no secret. Same services, rules and audit log as `/v1/_operatortokendef`.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.errors import ApplicationError
from apps.substrate import tokens
from apps.substrate.kinds import Refused

BY = "cli"


def _scopes(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [s.strip() for s in value.split(",") if s.strip()]


class Command(BaseCommand):
    help = "Mint, list, rotate and revoke operator bearer tokens (OperatorTokenDef)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("action", choices=["create", "list", "rotate", "revoke"])
        parser.add_argument(
            "--name", help="token name, [a-zA-Z0-9_-]{1,64} (create; rotate/revoke address its live token)"
        )
        parser.add_argument("--def-id", help="address one token row by id (rotate, revoke)")
        parser.add_argument("--tenant", help="tenant id the token acts in (create; required)")
        parser.add_argument("--subject", help="principal subject (create; default tok-<name>)")
        parser.add_argument("--scopes", help="comma-separated scopes (create; default substrate:admin)")
        parser.add_argument("--grace-seconds", type=int, help="rotate: how long the old token keeps working")
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            out = self._run(options)
        except Refused as exc:
            raise CommandError(exc.message) from exc
        except ApplicationError as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        if options["json"]:
            self.stdout.write(json.dumps(out, indent=2))
        elif options["action"] == "list":
            self._print_list(out["tokens"])
        else:
            self._print_one(options["action"], out)

    def _run(self, options: dict[str, Any]) -> dict[str, Any]:
        action, name, def_id = options["action"], options["name"], options["def_id"]
        if action == "create":
            if not options["tenant"]:
                raise CommandError("--tenant is required")
            return tokens.token_create(
                name=name,
                tenant_id=options["tenant"],
                subject=options["subject"],
                scopes=_scopes(options["scopes"]),
                by=BY,
            )
        if action == "rotate":
            return tokens.token_rotate(name=name, def_id=def_id, grace_seconds=options["grace_seconds"], by=BY)
        if action == "revoke":
            return tokens.token_retire(name=name, def_id=def_id, by=BY)
        return tokens.token_list(name=name)

    def _print_one(self, action: str, out: dict[str, Any]) -> None:
        scopes = ",".join(out["scopes"])
        self.stdout.write(
            f"{action}: {out['name']} ({out['def_id']}) tenant={out['tenant_id']} subject={out['subject']}"
        )
        self.stdout.write(f"scopes: {scopes}")
        if "rotated_from" in out and action == "rotate":
            self.stdout.write(f"previous token {out['rotated_from']} stays valid until {out['prior_retires_at']}")
        if "token" in out:
            self.stdout.write(self.style.WARNING(out["warning"]))
            self.stdout.write(out["token"])
        if action == "revoke":
            state = "was already retired" if out["already_retired"] else "retired"
            self.stdout.write(f"{state} at {out['retired_at']}")

    def _print_list(self, rows: list[dict[str, Any]]) -> None:
        if not rows:
            self.stdout.write("no tokens")
            return
        self.stdout.write(
            "\t".join(["DEF_ID", "NAME", "TENANT", "SUBJECT", "SCOPES", "SUFFIX", "STATE", "CREATED", "RETIRED"])
        )
        for row in rows:
            fields = [
                row["def_id"],
                row["name"],
                row["tenant_id"],
                row["subject"],
                ",".join(row["scopes"]),
                row["token_suffix"],
                row["state"],
                row["created_at"],
                row["retired_at"] or "-",
            ]
            self.stdout.write("\t".join(fields))
