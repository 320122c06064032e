"""`manage.py grpc`: serve loomcycle.v1.Loomcycle on LOOMCYCLE_GRPC_ADDR (or --addr) until
SIGTERM (apps.grpcapi.server). `up` starts it when the address is set; compose runs it as
its own service."""

from __future__ import annotations

import asyncio
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = "Serve loomcycle's gRPC API (loomcycle.v1.Loomcycle, health, reflection) on LOOMCYCLE_GRPC_ADDR."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--addr", default=None, help="host:port (default: LOOMCYCLE_GRPC_ADDR)")

    def handle(self, *args: Any, **options: Any) -> None:
        from apps.grpcapi.server import serve  # the generated stubs: only in the process that serves
        from loomcycle_project import telemetry

        addr = options["addr"] or settings.LOOMCYCLE.grpc_addr
        if not addr:
            raise CommandError("no address: set LOOMCYCLE_GRPC_ADDR (host:port) or pass --addr")
        asyncio.run(serve(addr, tracing=telemetry.setup("grpc")))
