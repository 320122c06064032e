"""The gRPC server process (`manage.py grpc`, which `up` starts when LOOMCYCLE_GRPC_ADDR is
set): loomcycle.v1.Loomcycle, grpc.health.v1 and server reflection on one grpc.aio server.

It is its own process, beside the web tier: grpc.aio owns its event loop (Daphne's is
Twisted's), a crash of either leaves the other serving, and the two scale apart. Like the web
processes it runs no run: each RPC calls the services, which write rows and ring workers.

Limits (docs/configuration.md): the largest message received (a bigger one is refused with
RESOURCE_EXHAUSTED by grpc itself; the connection and other calls go on) and sent; HTTP/2
keepalive pings idle connections and drops dead ones; a client pinging too often is sent
GOAWAY. Tracing: the OpenTelemetry gRPC server interceptor when tracing is on, so a call's
span is the parent of the run it creates, as an HTTP request's is."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

import grpc
from django.conf import settings
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from apps.grpcapi.proto import loomcycle_pb2 as pb
from apps.grpcapi.proto import loomcycle_pb2_grpc as pb_grpc
from apps.grpcapi.servicer import Servicer

log = logging.getLogger("loomcycle.grpc")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Loomcycle"].full_name
STOP_GRACE_S = 10.0


def options() -> list[tuple[str, Any]]:
    conf = settings.LOOMCYCLE
    return [
        ("grpc.max_receive_message_length", conf.grpc_max_recv_bytes),
        ("grpc.max_send_message_length", conf.grpc_max_send_bytes),
        ("grpc.keepalive_time_ms", conf.grpc_keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", conf.grpc_keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", conf.grpc_min_ping_interval_ms),
        ("grpc.http2.max_ping_strikes", 2),
        # gRPC sets SO_REUSEPORT by default on Linux: a second server on a port in use would bind it
        # too, and the kernel would split new connections between the two (each with its own database,
        # config and tokens). Off, the second one fails to listen, with an error that says so.
        ("grpc.so_reuseport", 0),
    ]


def interceptors(tracing: bool) -> list[Any]:
    if not tracing:
        return []
    from opentelemetry.instrumentation.grpc import aio_server_interceptor

    return [aio_server_interceptor()]  # type: ignore[no-untyped-call]


async def build(addr: str, *, tracing: bool = False) -> tuple[grpc.aio.Server, int, HealthServicer]:
    """The server bound to `addr` (not started) and the port it got (`addr` may say :0)."""
    server = grpc.aio.server(options=options(), interceptors=interceptors(tracing))
    pb_grpc.add_LoomcycleServicer_to_server(Servicer(), server)  # type: ignore[no-untyped-call]
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    names = (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    port = server.add_insecure_port(addr)
    if port == 0:
        raise OSError(f"cannot listen on {addr} for gRPC")
    return server, port, health


async def serve(addr: str, *, tracing: bool = False) -> None:
    """Serve until SIGTERM/SIGINT; then NOT_SERVING, and calls get STOP_GRACE_S to finish."""
    server, port, health = await build(addr, tracing=tracing)
    await server.start()
    for name in ("", SERVICE_NAME):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    log.info("gRPC: loomcycle.v1.Loomcycle on %s (port %d)", addr, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await health.enter_graceful_shutdown()
    await server.stop(STOP_GRACE_S)
