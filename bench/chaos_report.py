"""The figures and the verdict of the large chaos run (bench/chaos.py): the contract
(tests/chaos/harness.py) plus the SSE readers' frames and the fairness and
admission slots, recovery per fault kind, and one markdown table row for
docs/reliability.md."""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict

from django.conf import settings

from apps.channels.models import ChannelMessage
from apps.core.redis import sync_client
from apps.gateway.fairness.config import RUNS_KEY, TENANT_KEY, USER_KEY
from apps.runs.models import Run, RunStatus
from bench.chaos_driver import Driver
from bench.chaos_sse import check
from bench.stack import pct
from tests.chaos import harness
from tests.chaos.harness import INBOX, Fault

SLOT_WAIT_S = 30.0  # the sweeper frees a slot its run's process died holding within one sweep (1 s here)


def slot_violations() -> list[str]:
    """No fairness slot held once every run ended (after at most SLOT_WAIT_S: a slot a killed
    process held is the sweeper's to free), and no run left waiting for an admission slot."""
    client = sync_client()

    def held() -> list[str]:
        sets = [k.decode() for p in (USER_KEY, TENANT_KEY) for k in client.scan_iter(p + "*")]
        return [f"{k}: {client.zcard(k)}" for k in sets if client.zcard(k)] + (
            [f"{RUNS_KEY}: {client.hlen(RUNS_KEY)}"] if client.hlen(RUNS_KEY) else []
        )

    try:
        harness.wait_until(lambda: not held(), SLOT_WAIT_S, "fairness slots released", 0.5)
        out = []
    except TimeoutError:
        out = [f"fairness slots still held {SLOT_WAIT_S:.0f} s after every run ended: {held()[:5]}"]
    if n := Run.objects.filter(status=RunStatus.WAITING_SLOT).count():
        out.append(f"{n} runs still waiting for an admission slot")
    return out


def inbox_violations(driver: Driver) -> list[str]:
    """One publish per waiting run: the driver's retries never doubled one."""
    users = Counter(ChannelMessage.objects.filter(channel=INBOX).values_list("scope_id", flat=True))
    return [f"user {u}: {n} inbox messages where 1 was due" for u, n in users.items() if n != 1]


def recoveries(faults: list[Fault]) -> dict[str, list[float]]:
    """Per kind, each fault's recovery: until every run it hit progressed again (its max)."""
    out: dict[str, list[float]] = defaultdict(list)
    for fault in faults:
        delays = [fault.measured] if fault.measured is not None else harness.next_event_s(fault)
        if delays:
            out[fault.kind].append(max(delays))
    return out


def report(
    stuck: list[str],
    driver: Driver,
    faults: list[Fault],
    *,
    n: int,
    seed: int,
    wall: float,
    load: tuple[float, float],
    steal: float,
) -> None:
    losses = Counter(r for f in faults if f.kind in ("kill_worker", "stall_worker") for r in f.affected)
    harness.gave_up(driver.expect, losses, settings.LOOMCYCLE.max_attempts)
    found = [
        *stuck,
        *harness.violations(driver.expect),
        *(v for r in driver.readers for v in check(r)),
        *slot_violations(),
        *inbox_violations(driver),
    ]
    runs = len(driver.expect.everything())
    children = Run.objects.filter(parent_id__in=driver.expect.spawns).count()
    kinds = Counter(f.kind for f in faults)
    rec = recoveries(faults)
    print(f"\nchaos: {runs} runs (+{children} children), seed {seed}, wall {wall:.0f} s")
    print(f"faults: {dict(kinds)} ({sum(kinds.values())} in all)")
    for kind, values in sorted(rec.items()):
        print(
            f"recovery after {kind}: p50 {pct(values, 0.5):.2f} s, p100 {max(values):.2f} s over {len(values)} faults"
        )
    print(
        f"runs that gave up as designed (hit by >= {settings.LOOMCYCLE.max_attempts} worker losses): "
        f"{len(driver.expect.gave_up)}"
    )
    print(f"SSE readers: {len(driver.readers)}, reattaches {sum(len(r.reattach_s) for r in driver.readers)}")
    print(f"API errors while faults were in progress (5xx or no answer, retried): {len(driver.api_errors)}")
    for line in driver.api_errors[:20]:
        print("   ", line)
    print(f"load average (1 min) {load[0]:.1f} at the start, {load[1]:.1f} at the end; host steal {steal:.0f} %")
    print(f"violations: {len(found)}")
    for line in found[:50]:
        print("   ", line)
    recovery = "; ".join(f"{k} p50 {pct(v, 0.5):.1f} s / p100 {max(v):.1f} s" for k, v in sorted(rec.items()))
    print(
        f"\n| {time.strftime('%Y-%m-%d')} | shared {os.cpu_count()}-core VM, load {load[0]:.1f}→{load[1]:.1f}, "
        f"steal {steal:.0f} % | `make chaos N={n} SEED={seed}` | {runs} (+{children}) | "
        f"{', '.join(f'{n} {k}' for k, n in kinds.items())} | {len(found)} | {recovery} | {wall:.0f} s |"
    )
