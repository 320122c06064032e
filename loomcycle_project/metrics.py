"""GET /metrics: Prometheus text for the whole cluster (docs/operations.md lists every metric).

Two sources, both cluster-wide, so any web replica answers for all of them:
- work done (iterations, provider calls, tool calls, finished runs, schedule
  fires, webhook deliveries): counters and histograms every process adds to
  in Redis (apps.core.metrics);
- state (live runs by status, in-flight runs per tenant, queue depth,
  fairness slots, database connections): read from Postgres and Redis at
  scrape time, with bounded queries (live runs only; a tenant label only on
  the in-flight gauge, capped at IN_FLIGHT_TENANTS).
The scope is SPEC 2.1's (`substrate:admin`; open mode: loopback only).
A source that cannot be read is left out of the scrape and reported by
`loomcycle_scrape_error{source}` = 1, so the scrape itself still answers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

import apps.runs.engine.metrics
import apps.triggers.metrics  # noqa: F401  (declares the schedule and webhook counters)
from apps.budgets.selectors import limits_list
from apps.core import metrics as core_metrics
from apps.core.errors import ApplicationError, NotFound
from apps.gateway.fairness import FairnessUnavailable, slots_stats
from apps.gateway.usage_metrics import USAGE_COST, USAGE_TOKENS
from apps.runs.selectors import runs_in_flight_by_tenant, runs_live_by_status
from apps.runs.statuses import PARKED
from apps.substrate.auth import authenticate_for, bearer_from_headers, lower_headers
from loomcycle_project.api import on_application_error
from workers.queues import MAINTENANCE, RUNS

log = logging.getLogger("loomcycle.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
IN_FLIGHT_TENANTS = 20
LIMIT_GAUGE_MAX = 200
QUEUES = (RUNS, MAINTENANCE)
# kombu's Redis transport keeps priority p > 0 of queue q in the list "q\x06\x16p" (priority_steps 0,3,6,9).
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


def _work_done() -> Iterator[Metric]:
    """The Redis counters and histograms, every declared metric present (empty when nothing ran)."""
    stored = core_metrics.read_all()
    fold_tenants(stored, settings.LOOMCYCLE.metrics_tenant_labels)
    for metric in core_metrics.declared():
        series = stored.get(metric.name, [])
        if isinstance(metric, core_metrics.Counter):
            counter = CounterMetricFamily(metric.name, metric.help, labels=metric.labels)
            for s in series:
                counter.add_metric(list(s.values), s.total)
            yield counter
        else:
            hist = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
            for s in series:
                hist.add_metric(list(s.values), list(s.cumulative()), s.sum)
            yield hist


_TENANT_LABELLED = (USAGE_TOKENS.name, USAGE_COST.name)


def fold_tenants(stored: dict[str, list[core_metrics.Series]], keep: int) -> None:
    """The spend counters keep a tenant label for the `keep` biggest spenders (by tokens);
    every other tenant's series are summed into tenant="other" (a bounded label set)."""
    spent: dict[str, float] = {}
    for s in stored.get(USAGE_TOKENS.name, []):
        spent[s.values[2]] = spent.get(s.values[2], 0.0) + s.total
    kept = set(sorted(spent, key=lambda t: (-spent[t], t))[:keep])
    for name in _TENANT_LABELLED:
        merged: dict[tuple[str, ...], core_metrics.Series] = {}
        for s in stored.get(name, []):
            values = tuple(v if i != 2 or v in kept else "other" for i, v in enumerate(s.values))
            into = merged.setdefault(values, core_metrics.Series(values=values))
            into.total += s.total
        if name in stored:
            stored[name] = list(merged.values())


def _budgets() -> Iterator[Metric]:
    """Each hard budget's remaining fraction in its current window (the LIMIT_GAUGE_MAX least left)."""
    gauge = GaugeMetricFamily(
        "loomcycle_budget_remaining_ratio",
        f"Unspent fraction of each hard budget this window (the {LIMIT_GAUGE_MAX} with least left).",
        labels=["scope", "tenant", "scope_id", "kind", "window"],
    )
    views = [(v, v.row.hard_limit) for v in limits_list(tenant_id=None) if v.row.hard_limit]
    left = sorted(((max(0.0, 1 - float(v.used / hard)), v) for v, hard in views), key=lambda p: p[0])
    for ratio, v in left[:LIMIT_GAUGE_MAX]:
        gauge.add_metric([v.row.scope, v.row.tenant_id, v.row.scope_id, v.row.kind, v.row.window], ratio)
    yield gauge


def _runs() -> Iterator[Metric]:
    by_status = runs_live_by_status()
    live = GaugeMetricFamily("loomcycle_runs", "Live (non-terminal) runs by status.", labels=["status"])
    parked = GaugeMetricFamily(
        "loomcycle_runs_parked", "Runs parked without a worker, by kind of wait.", labels=["kind"]
    )
    for status, n in sorted(by_status.items()):
        live.add_metric([status], n)
        if status in PARKED:
            parked.add_metric([status], n)
    yield live
    yield parked
    tenants = GaugeMetricFamily(
        "loomcycle_runs_in_flight",
        f"Top-level runs queued or running per tenant (the {IN_FLIGHT_TENANTS} busiest; the rest as _other).",
        labels=["tenant"],
    )
    for tenant, n in runs_in_flight_by_tenant(limit=IN_FLIGHT_TENANTS):
        tenants.add_metric([tenant], n)
    yield tenants


def _database() -> Iterator[Metric]:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT coalesce(state, 'unknown'), count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() GROUP BY 1"
        )
        rows = cur.fetchall()
    conns = GaugeMetricFamily(
        "loomcycle_db_connections", "Connections to the database from every process, by state.", labels=["state"]
    )
    for state, n in sorted(rows):
        conns.add_metric([state], n)
    yield conns
    pool = getattr(connection, "pool", None)
    if pool is not None:
        stats = pool.get_stats()
        local = GaugeMetricFamily(
            "loomcycle_db_pool_connections",
            "This web process's connection pool: connections open and idle, and its max size.",
            labels=["state"],
        )
        local.add_metric(["open"], stats.get("pool_size", 0))
        local.add_metric(["idle"], stats.get("pool_available", 0))
        local.add_metric(["max"], pool.max_size)
        yield local


def _redis() -> Iterator[Metric]:
    from apps.core.redis import sync_client

    client = sync_client()
    depth = GaugeMetricFamily("loomcycle_queue_depth", "Messages waiting in each Celery queue.", labels=["queue"])
    pipe = client.pipeline(transaction=False)
    for queue in QUEUES:
        for suffix in _PRIORITY_SUFFIXES:
            pipe.llen(queue + suffix)
    lengths = pipe.execute()
    for i, queue in enumerate(QUEUES):
        depth.add_metric([queue], sum(lengths[i * len(_PRIORITY_SUFFIXES) : (i + 1) * len(_PRIORITY_SUFFIXES)]))
    yield depth


def _fairness() -> Iterator[Metric]:
    stats = slots_stats()
    held = GaugeMetricFamily(
        "loomcycle_fairness_slots_held", "Fairness slots held across the cluster, by gate kind.", labels=["kind"]
    )
    held.add_metric(["user"], sum(stats["per_user"].values()))
    held.add_metric(["tenant"], sum(stats["per_tenant"].values()))
    yield held
    provider = GaugeMetricFamily(
        "loomcycle_provider_slots",
        "Provider concurrency gates (max_concurrent): slots active, callers queued, and the cap.",
        labels=["provider", "state"],
    )
    for pid, row in sorted(stats["providers"].items()):
        for state in ("active", "queued", "cap"):
            provider.add_metric([pid, state], row[state])
    yield provider


_SOURCES: dict[str, Callable[[], Iterator[Metric]]] = {
    "work_done": _work_done,
    "runs": _runs,
    "database": _database,
    "redis": _redis,
    "fairness": _fairness,
    "budgets": _budgets,
}


class ClusterCollector(Collector):
    """Reads every source on each scrape; one that fails is reported, not raised."""

    def collect(self) -> Iterator[Metric]:
        errors = GaugeMetricFamily(
            "loomcycle_scrape_error", "1 when a source could not be read in this scrape.", labels=["source"]
        )
        try:
            for name, source in _SOURCES.items():
                try:
                    families = list(source())
                except (DatabaseError, redis.RedisError, OSError, FairnessUnavailable) as exc:
                    log.warning("metrics: source %s unreadable: %s", name, exc)
                    errors.add_metric([name], 1)
                    continue
                errors.add_metric([name], 0)
                yield from families
        finally:
            connection.close()
        yield errors


def render() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ClusterCollector())
    return generate_latest(registry)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """404 when metrics are off; else the route's scope (admin), then the text."""
    try:
        if not settings.LOOMCYCLE.metrics_enabled:
            raise NotFound("metrics are disabled (LOOMCYCLE_METRICS_ENABLED)", code="metrics_disabled")
        token = bearer_from_headers(lower_headers(request.headers.items()))
        authenticate_for(token, request.META.get("REMOTE_ADDR"), request.method or "GET", "/metrics")
    except ApplicationError as exc:
        return on_application_error(request, exc)
    return HttpResponse(render(), content_type=CONTENT_TYPE)
