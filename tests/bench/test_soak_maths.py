"""The soak's figures (bench/soak.py, `make soak`): its percentile, its 5-minute
windows of iteration overhead and its memory-flatness verdict, on fixed inputs.
The soak itself runs for an hour and is not part of `make test`."""

from __future__ import annotations

import math

from bench.soak import flat_verdict, pct, window_stats


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100, shuffled order must not matter
    assert pct(values[::-1], 0.5) == 51.0
    assert pct(values, 0.99) == 100.0
    assert pct([7.0], 0.99) == 7.0
    assert math.isnan(pct([], 0.5))


def test_windows_split_samples_by_elapsed_time_and_keep_empty_windows() -> None:
    samples = [(10.0, 1.0), (299.9, 3.0), (300.0, 5.0), (950.0, 9.0)]
    rows = window_stats(samples, 300.0)
    assert [(r["window"], r["start_s"], r["n"]) for r in rows] == [
        (0, 0.0, 2),
        (1, 300.0, 1),
        (2, 600.0, 0),
        (3, 900.0, 1),
    ]
    assert (rows[0]["p50_ms"], rows[0]["p99_ms"]) == (3.0, 3.0)
    assert rows[1]["p99_ms"] == 5.0
    assert math.isnan(rows[2]["p99_ms"])
    assert window_stats([], 300.0) == []


def test_memory_is_flat_when_the_peak_after_warm_up_is_within_the_limit() -> None:
    series = [(0.0, 50.0), (120.0, 100.0), (300.0, 120.0), (600.0, 150.0), (900.0, 179.0)]
    v = flat_verdict(series, warmup_s=300.0, limit=1.5)
    assert (v["start"], v["baseline"], v["peak_after"], v["end"], v["max"]) == (50.0, 120.0, 179.0, 179.0, 179.0)
    assert v["pass"] is True  # 179 <= 1.5 x 120; the warm-up's growth from 50 does not count


def test_memory_that_grows_past_the_limit_after_warm_up_fails() -> None:
    series = [(0.0, 100.0), (300.0, 100.0), (600.0, 140.0), (900.0, 151.0), (1200.0, 120.0)]
    v = flat_verdict(series, warmup_s=300.0, limit=1.5)
    assert v["pass"] is False
    assert v["ratio"] == 1.51


def test_no_sample_after_warm_up_gives_no_verdict() -> None:
    v = flat_verdict([(0.0, 10.0), (60.0, 12.0)], warmup_s=300.0, limit=1.5)
    assert v["pass"] is None
    assert v["max"] == 12.0
