"""Cluster-wide counters and histograms of work done, kept in one Redis hash.

Why Redis and not prometheus-client's multiprocess mode: a multiprocess
directory is per host, so a scrape of one web replica would only see the
workers on its host; the Redis hash is what every process of the cluster
writes, so any replica's `/metrics` shows the whole cluster (docs/architecture.md).

Invariants:
- A metric is declared once, at import (`Counter`, `Histogram`), with a fixed
  label set; `declared()` is what the exposition walks.
- A process records into a `Batch` (no I/O) and flushes it with ONE pipelined
  round trip (`Batch.flush`); the engine flushes once per committed iteration.
- Values only grow (HINCRBYFLOAT); a Redis flush resets them, which Prometheus
  reads as a counter reset.
- A histogram stores each observation in the one bucket it falls in; the
  exposition makes the buckets cumulative.
- A label value is cut to LABEL_MAX characters; callers pass only bounded
  values (provider and model ids, registered tool names, statuses).
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.conf import settings
from django.db import transaction
from redis import RedisError

from apps.core.redis import sync_client

log = logging.getLogger("loomcycle.metrics")

KEY = "lc:metrics"
LABEL_MAX = 128
# Seconds: iterations, provider calls and tool calls all fall between a few ms and minutes.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
INF = float("inf")

_DECLARED: dict[str, Counter | Histogram] = {}


@dataclass(frozen=True)
class Counter:
    """A monotonically growing count (`<name>_total` in the exposition)."""

    name: str
    help: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _declare(self)


@dataclass(frozen=True)
class Histogram:
    """Observations in seconds over BUCKETS, with their sum and count."""

    name: str
    help: str
    labels: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _declare(self)


def _declare(metric: Counter | Histogram) -> None:
    existing = _DECLARED.get(metric.name)
    if existing is not None and existing != metric:
        raise ValueError(f"metric {metric.name!r} declared twice with different shapes")
    _DECLARED[metric.name] = metric


def declared() -> list[Counter | Histogram]:
    return sorted(_DECLARED.values(), key=lambda m: m.name)


def _field(name: str, part: str, values: tuple[str, ...]) -> str:
    """The hash field of one series: JSON [name, part, [label values...]]."""
    return json.dumps([name, part, [v[:LABEL_MAX] for v in values]], separators=(",", ":"))


def bucket_index(seconds: float) -> int:
    """The index of the smallest bucket bound >= seconds (len(BUCKETS) = +Inf)."""
    for i, bound in enumerate(BUCKETS):
        if seconds <= bound:
            return i
    return len(BUCKETS)


@dataclass
class Batch:
    """Increments collected in memory; `flush` writes them in one round trip."""

    deltas: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def inc(self, metric: Counter, values: tuple[str, ...] = (), n: float = 1.0) -> None:
        if len(values) != len(metric.labels):
            raise ValueError(f"{metric.name}: expected labels {metric.labels}, got {values}")
        self.deltas[_field(metric.name, "total", values)] += n

    def observe(self, metric: Histogram, values: tuple[str, ...], seconds: float) -> None:
        if len(values) != len(metric.labels):
            raise ValueError(f"{metric.name}: expected labels {metric.labels}, got {values}")
        seconds = max(0.0, seconds)
        self.deltas[_field(metric.name, f"b{bucket_index(seconds)}", values)] += 1
        self.deltas[_field(metric.name, "sum", values)] += seconds

    def flush(self) -> None:
        """One pipelined HINCRBYFLOAT per series. A Redis error loses this batch
        (logged): metrics never fail or delay the work they count."""
        if not self.deltas:
            return
        try:
            pipe = sync_client().pipeline(transaction=False)
            for key, delta in self.deltas.items():
                pipe.hincrbyfloat(KEY, key, delta)
            pipe.execute()
        except (RedisError, OSError) as exc:
            log.warning("metrics: %d increment(s) lost, Redis refused them: %s", len(self.deltas), exc)
        finally:
            self.deltas.clear()


def count_on_commit(metric: Counter, values: tuple[str, ...] = ()) -> None:
    """+1 once the current transaction commits (at once outside one); nothing
    when LOOMCYCLE_METRICS_ENABLED is off. For writes outside the engine's step
    (schedule fires, webhook deliveries), so a rolled-back write counts nothing."""
    if not settings.LOOMCYCLE.metrics_enabled:
        return
    batch = Batch()
    batch.inc(metric, values)
    transaction.on_commit(batch.flush)


@dataclass
class Series:
    """One label set of a metric, as read back: a count, or a histogram's buckets and sum."""

    values: tuple[str, ...]
    total: float = 0.0
    buckets: list[float] = field(default_factory=lambda: [0.0] * (len(BUCKETS) + 1))
    sum: float = 0.0

    def cumulative(self) -> Iterator[tuple[str, float]]:
        """Prometheus's (le, cumulative count) pairs, +Inf last."""
        running = 0.0
        for i, count in enumerate(self.buckets):
            running += count
            yield ("+Inf" if i == len(BUCKETS) else repr(BUCKETS[i])), running


def read_all() -> dict[str, list[Series]]:
    """Every series in the hash, by metric name (fields of undeclared metrics or
    of another label shape are skipped: left by an older release)."""
    raw = sync_client().hgetall(KEY)
    out: dict[str, dict[tuple[str, ...], Series]] = defaultdict(dict)
    for key, value in raw.items():
        try:
            name, part, values = json.loads(key)
        except (ValueError, TypeError):
            continue
        metric = _DECLARED.get(name)
        if metric is None or len(values) != len(metric.labels):
            continue
        labels = tuple(str(v) for v in values)
        series = out[name].setdefault(labels, Series(labels))
        _apply(series, str(part), float(value))
    return {name: sorted(by.values(), key=lambda s: s.values) for name, by in out.items()}


def _apply(series: Series, part: str, value: float) -> None:
    if part == "total":
        series.total = value
    elif part == "sum":
        series.sum = value
    elif part.startswith("b") and part[1:].isdigit() and int(part[1:]) <= len(BUCKETS):
        series.buckets[int(part[1:])] = value
