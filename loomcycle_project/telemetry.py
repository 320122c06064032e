"""OpenTelemetry, set up once per process: web (Daphne), each Celery worker, beat,
`manage.py mcp` (the stdio MCP server creates runs: loomcycle_project/cli.py) and
`manage.py grpc` (the gRPC server). No other command runs the engine or creates runs; `up`
only starts the processes above.

What a process installs is decided by `settings.LOOMCYCLE.tracing_exporters`
(env.py reads OTEL_TRACES_EXPORTER, OTEL_SDK_DISABLED and whether an OTLP
endpoint is set); everything else is the SDK's own OTEL_* configuration, read
by the SDK: the OTLP endpoint and headers, the sampler (OTEL_TRACES_SAMPLER),
the batch delays (OTEL_BSP_*), OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME,
which overrides the per-kind default name (`loomcycle-web`, `loomcycle-worker`,
`loomcycle-beat`, `loomcycle-mcp`, `loomcycle-grpc`).

Invariants:
- no exporter configured: nothing is installed (no tracer provider, no
  instrumentation); the runtime's own spans then come from the API's no-op
  tracer, and apps.runs.tracing skips even those;
- a tracer provider set before us (a host Django project's) is kept, with or
  without OTEL_* exporters here: only the instrumentations are added, and its
  exporters get our spans;
- at most once per process (`setup` is idempotent per pid, so a forked child
  sets itself up again, as Celery's prefork children must).

Celery's processes are set up from their signals (`connect_celery`, at the project's
AppConfig.ready(), so workers/ imports nothing of this module): in the process that runs tasks,
which is each prefork child (`worker_process_init`, as the Celery instrumentation asks) or
the worker itself for the threads and solo pools, which send no such signal per child; and in beat.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import Any

from celery import concurrency
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.signals import beat_init, worker_init, worker_process_init
from django.conf import settings
from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

log = logging.getLogger("loomcycle.telemetry")

# mcp: `manage.py mcp`, which creates runs; grpc: `manage.py grpc` (apps.grpcapi.server adds
# the gRPC server instrumentation as an interceptor when this returns True).
KINDS = frozenset({"web", "worker", "beat", "mcp", "grpc"})
_set_up_in: int | None = None  # the pid that ran `setup`


def setup(kind: str) -> bool:
    """Install tracing for a process of `kind` (web, worker, beat); True when it
    did (an exporter is configured and this process had not set it up yet)."""
    global _set_up_in
    if kind not in KINDS:
        raise ValueError(f"unknown process kind {kind!r}")
    exporters = settings.LOOMCYCLE.tracing_exporters
    hosted = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # a host project's
    if (not exporters and not hosted) or _set_up_in == os.getpid():
        return False
    _set_up_in = os.getpid()
    if not hosted:
        trace.set_tracer_provider(_provider(kind, exporters))
        _install_meter_provider(kind, exporters)
    _instrument(kind)
    where = "the host project's tracer provider" if hosted else "exporters " + ", ".join(exporters)
    log.info("tracing on (%s): %s", service_name(kind), where)
    return True


def service_name(kind: str) -> str:
    """OTEL_SERVICE_NAME (or service.name in OTEL_RESOURCE_ATTRIBUTES), else `loomcycle-<kind>`."""
    detected = OTELResourceDetector().detect().attributes.get(SERVICE_NAME)
    return str(detected) if detected else f"loomcycle-{kind}"


def _provider(kind: str, exporters: tuple[str, ...]) -> TracerProvider:
    instance = f"{settings.LOOMCYCLE.replica_id or socket.gethostname()}:{os.getpid()}"
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: service_name(kind), SERVICE_INSTANCE_ID: instance})
    )
    for name in exporters:
        provider.add_span_processor(_processor(name, kind))
    return provider


def _install_meter_provider(kind: str, exporters: tuple[str, ...]) -> None:
    """The GenAI client metrics (apps.core.genai) go where the spans go: a MeterProvider with one
    periodic reader per trace exporter, unless a host project installed a MeterProvider already."""
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, PeriodicExportingMetricReader

    if type(metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider":
        return
    readers = []
    for name in exporters:
        exporter: MetricExporter
        if name == "console":
            exporter = ConsoleMetricExporter(out=sys.stderr if kind == "mcp" else sys.stdout)
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            exporter = OTLPMetricExporter()  # endpoint, headers: the SDK's OTEL_EXPORTER_OTLP_*
        readers.append(PeriodicExportingMetricReader(exporter))
    instance = f"{settings.LOOMCYCLE.replica_id or socket.gethostname()}:{os.getpid()}"
    resource = Resource.create({SERVICE_NAME: service_name(kind), SERVICE_INSTANCE_ID: instance})
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


def _processor(name: str, kind: str) -> SpanProcessor:
    if name == "console":  # dev: each span printed as it ends (stderr for mcp: its stdout is the protocol)
        return SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr if kind == "mcp" else sys.stdout))
    # Imported only when used: the exporter pulls in protobuf and requests.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return BatchSpanProcessor(OTLPSpanExporter())  # endpoint, headers, timeout: the SDK's OTEL_EXPORTER_OTLP_*


def _instrument(kind: str) -> None:
    """Celery's in every process (a publish from web or beat carries the context
    to the worker that runs the task); Django's in web. Middleware is added to
    settings.MIDDLEWARE, so web calls this before the ASGI handler loads it."""
    CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]
    if kind == "web":
        DjangoInstrumentor().instrument()


def connect_celery() -> None:
    """Set tracing up in Celery's processes from their signals (idempotent: ready() may run twice)."""
    worker_init.connect(_on_worker_init, weak=False, dispatch_uid="telemetry.worker_init")
    worker_process_init.connect(_on_worker_process_init, weak=False, dispatch_uid="telemetry.worker_process_init")
    beat_init.connect(_on_beat_init, weak=False, dispatch_uid="telemetry.beat_init")


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    if not issubclass(concurrency.get_implementation(getattr(sender, "pool_cls", "prefork")), PreforkPool):
        setup("worker")  # threads/solo: tasks run in this process (prefork: in each child, below)


def _on_worker_process_init(sender: Any = None, **_: Any) -> None:
    setup("worker")  # once per process: the solo pool sends this after worker_init


def _on_beat_init(sender: Any = None, **_: Any) -> None:
    setup("beat")
