"""Observability test shapes: a JSON-logging worker, an in-process OTLP receiver, the browser binary."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests import procs


@contextmanager
def json_logging_worker(env: dict[str, str], log: Path, name: str = "json") -> Iterator[Path]:
    """One worker process (`<name>@host`, 4 threads, queues runs and maintenance) with `env`,
    logging JSON at DEBUG, so every library's records go through the formatter too; yields
    its log file (stdout and stderr) and stops it on leaving."""
    env = {
        **env,
        "LOOMCYCLE_LOG_FORMAT": "json",
        "LOOMCYCLE_LOG_LEVEL": "DEBUG",
        # This host runs the suite as root, which Celery warns about before logging is set up
        # (a container runs the worker as an unprivileged user).
        "PYTHONWARNINGS": "ignore:You're running the worker with superuser privileges",
    }
    argv = [*procs.CELERY, "--quiet", "worker", "--pool", "threads", "-c", "4", "-Q", "runs,maintenance", "-l", "DEBUG"]
    proc = procs.spawn([*argv, "-n", f"{name}@%h", "--without-gossip", "--without-mingle"], env, log)
    try:
        yield log
    finally:
        procs.stop(proc)


def json_records(log: Path) -> list[dict[str, Any]]:
    """Every line of the log, each parsed as one JSON object (a line that is not fails the test)."""
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except ValueError:
            pytest.fail(f"line {number} of {log} is not JSON: {line[:300]!r}")
    return records


@dataclasses.dataclass(frozen=True)
class Span:
    service: str
    instance: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    events: tuple[tuple[str, dict[str, Any]], ...]


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items}


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: every span of every export, decoded."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[Span] = []
        self.lock = threading.Lock()

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self.lock:
            for rs in request.resource_spans:
                resource = _attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    self.spans.extend(_span(resource, s) for s in ss.spans)

    def snapshot(self) -> list[Span]:
        with self.lock:
            return list(self.spans)


def _span(resource: dict[str, Any], s: Any) -> Span:
    return Span(
        service=str(resource.get("service.name")),
        instance=str(resource.get("service.instance.id")),
        name=s.name,
        kind=s.kind,
        trace_id=s.trace_id.hex(),
        span_id=s.span_id.hex(),
        parent_id=s.parent_span_id.hex(),
        attributes=_attrs(s.attributes),
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
        events=tuple((e.name, _attrs(e.attributes)) for e in s.events),
    )


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v1/traces" or self.headers["Content-Type"] != "application/x-protobuf":
            self.send_error(404 if self.path != "/v1/traces" else 415)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.add(request)
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: Any) -> None:
        return  # the test reads spans, not access logs


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A `Receiver` serving on a loopback port until the block ends."""
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def otel_env(receiver: Receiver) -> dict[str, str]:
    """A process exports to `receiver`, every 100 ms."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_address[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }


CHROMIUM = "/usr/bin/chromium"


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
