"""Taking and giving back slots: runs (admission, release, reconciliation),
gateway calls, provider calls, and the cluster-wide counts for the stats."""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from apps.core.redis import sync_client
from apps.gateway import waits
from apps.gateway.fairness import store
from apps.gateway.fairness.config import (
    INDEX_KEY,
    PROVIDER_KEY,
    RUNS_KEY,
    TENANT_KEY,
    USER_KEY,
    WAITING_KEY,
    FairnessUnavailable,
    caps,
    provider_cap,
    provider_gate,
    user_gates,
)
from apps.gateway.providers import ProviderCancelled, provider_ids

log = logging.getLogger("loomcycle.fairness")

RUN_TTL_MS = 3_600_000  # refreshed by every sweep while the run lives
RECONCILE_GRACE_MS = 60_000  # a slot taken for a run whose row is not committed yet is not "vanished"
POLL_MIN_S, POLL_MAX_S = 0.02, 0.25


def _member(kind: str) -> str:
    return f"{kind}_{secrets.token_hex(8)}"


# --- runs --------------------------------------------------------------------------------


def run_slot_take(*, run_id: str, tenant_id: str, user_id: str) -> None:
    """Admit a run, top-level or descendant (429 when its user or tenant is at cap). Call
    before the run row is written; `run_slot_release` if the write fails."""
    gates = user_gates(tenant_id, user_id)
    if gates and (full := store.take(gates, run_id, RUN_TTL_MS, run=True)) is not None:
        raise full.refused()


def run_slot_release(run_id: str) -> None:
    """Give a finished run's slot back. Idempotent; a Redis error is logged
    and the sweeper's reconciliation frees the slot instead."""
    c = caps()
    if c.per_user <= 0 and c.per_tenant <= 0:
        return
    try:
        store.scripts()["runs"](keys=[RUNS_KEY, INDEX_KEY], args=["release", 0, run_id])
    except redis.RedisError as exc:
        log.warning("run %s: slot not released (%s); the sweeper will free it", run_id, exc)


@dataclass(frozen=True)
class Reconciled:
    kept: int
    freed: int


Liveness = Callable[[list[str]], dict[str, bool]]


def run_slots_reconcile(*, liveness: Liveness, grace_ms: int = RECONCILE_GRACE_MS) -> Reconciled:
    """Refresh the slots of live runs; free those of terminal runs and of runs
    whose row still does not exist `grace_ms` after the slot was taken.
    `liveness(ids)` maps each existing run id to whether it is live."""
    client = sync_client()
    seconds, micros = client.time()
    taken_before_ms = int(seconds) * 1000 + int(micros) // 1000 - grace_ms
    kept = freed = 0
    batch: list[tuple[str, int]] = []
    for field, entry in client.hscan_iter(RUNS_KEY, count=500):
        batch.append((field.decode(), int(entry.split(b"\n", 1)[0])))
        if len(batch) >= 500:
            k, f = _reconcile_batch(batch, liveness, taken_before_ms)
            kept, freed, batch = kept + k, freed + f, []
    if batch:
        k, f = _reconcile_batch(batch, liveness, taken_before_ms)
        kept, freed = kept + k, freed + f
    return Reconciled(kept=kept, freed=freed)


def _reconcile_batch(batch: list[tuple[str, int]], liveness: Liveness, taken_before_ms: int) -> tuple[int, int]:
    found = liveness([run_id for run_id, _ in batch])
    keep = [run_id for run_id, _ in batch if found.get(run_id)]
    drop = [
        run_id
        for run_id, taken_ms in batch
        if (run_id in found and not found[run_id]) or (run_id not in found and taken_ms < taken_before_ms)
    ]
    runs = store.scripts()["runs"]
    if keep:  # a run released meanwhile has no entry left: the refresh never resurrects it
        runs(keys=[RUNS_KEY, INDEX_KEY], args=["refresh", RUN_TTL_MS, *keep])
    freed = int(runs(keys=[RUNS_KEY, INDEX_KEY], args=["release", 0, *drop])) if drop else 0
    return len(keep), freed


# --- gateway calls and provider calls -----------------------------------------------------


@contextmanager
def call_slot(tenant_id: str, user_id: str) -> Iterator[None]:
    """Hold a user (and tenant) slot, the one runs count against, for one
    gateway call; 429 per_user_quota_exhausted / per_tenant_quota_exhausted."""
    gates = user_gates(tenant_id, user_id)
    if not gates:
        yield
        return
    member = _member("c")
    if (full := store.take(gates, member, store.CALL_TTL_MS)) is not None:
        raise full.refused()
    with store.held(gates, member):
        yield


@asynccontextmanager
async def acall_slot(tenant_id: str, user_id: str) -> AsyncIterator[None]:
    """`call_slot` for async views."""
    gates = user_gates(tenant_id, user_id)
    if not gates:
        yield
        return
    member = _member("c")
    if (full := await store.atake(gates, member, store.CALL_TTL_MS)) is not None:
        raise full.refused()
    async with store.aheld(gates, member):
        yield


def _next_delay(delay: float) -> float:
    return min(delay * 1.5, POLL_MAX_S)


@contextmanager
def provider_slot(provider_id: str, cap: int | None = None, *, cancel: threading.Event | None = None) -> Iterator[None]:
    """Hold a slot of a provider with `max_concurrent` for one provider call,
    waiting up to provider_queue_timeout_ms, then 429
    provider_concurrency_exhausted. `cancel` set while waiting raises
    ProviderCancelled. `cap` None reads the provider's configuration."""
    gate = provider_gate(provider_id, cap)
    if gate is None:
        yield
        return
    member, waiter = _member("p"), _member("w")
    deadline = time.monotonic() + caps().provider_queue_timeout_ms / 1000
    cancel = cancel or threading.Event()
    delay, waited = POLL_MIN_S, False
    try:
        while (full := store.take([gate], member, store.CALL_TTL_MS)) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise full.refused()
            waited = True
            store.mark_waiting(gate, waiter)  # counted as `queued` in the stats while it waits
            with waits.outside():  # an engine iteration queued here gives its admission slot up
                if cancel.wait(min(delay * random.uniform(0.8, 1.2), left)):
                    raise ProviderCancelled()
            delay = _next_delay(delay)
    finally:
        if waited:
            store.unmark_waiting(gate, waiter)
    with store.held([gate], member):
        yield


@asynccontextmanager
async def aprovider_slot(provider_id: str, cap: int | None = None) -> AsyncIterator[None]:
    """`provider_slot` for async callers; cancelling the task ends the wait."""
    gate = provider_gate(provider_id, cap)
    if gate is None:
        yield
        return
    member, waiter = _member("p"), _member("w")
    deadline = time.monotonic() + caps().provider_queue_timeout_ms / 1000
    delay, waited = POLL_MIN_S, False
    try:
        while (full := await store.atake([gate], member, store.CALL_TTL_MS)) is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise full.refused()
            waited = True
            await store.amark_waiting(gate, waiter)
            await asyncio.sleep(min(delay * random.uniform(0.8, 1.2), left))
            delay = _next_delay(delay)
    finally:
        if waited:
            await store.aunmark_waiting(gate, waiter)
    async with store.aheld([gate], member):
        yield


# --- stats --------------------------------------------------------------------------------


def provider_caps() -> dict[str, int]:
    """Every provider with a `max_concurrent` gate."""
    return {pid: cap for pid in provider_ids() if (cap := provider_cap(pid)) > 0}


def slots_stats() -> dict[str, Any]:
    """Held slots across the cluster: per user ("<tenant>/<user>", or the user
    alone in the default tenant ""), per tenant and per gated provider."""
    c, gated = caps(), provider_caps()
    keys = [key for pid in gated for key in (PROVIDER_KEY + pid, WAITING_KEY + pid)]
    try:
        held, counts = store.scripts()["stats"](keys=keys, args=[INDEX_KEY])
    except redis.RedisError as exc:
        raise FairnessUnavailable(f"concurrency stats are unavailable: {exc}") from exc
    per_user: dict[str, int] = {}
    per_tenant: dict[str, int] = {}
    for raw, n in zip(held[::2], held[1::2], strict=True):
        key = raw.decode()
        if key.startswith(USER_KEY):
            tenant, _, user = key[len(USER_KEY) :].rpartition("/")
            per_user[f"{tenant}/{user}" if tenant else user] = int(n)
        elif key.startswith(TENANT_KEY):
            per_tenant[key[len(TENANT_KEY) :]] = int(n)
    providers = {
        pid: {"active": int(counts[2 * i]), "queued": int(counts[2 * i + 1]), "cap": cap}
        for i, (pid, cap) in enumerate(gated.items())
    }
    return {
        "per_user": per_user,
        "per_tenant": per_tenant,
        "providers": providers,
        "caps": {"per_user": c.per_user, "per_tenant": c.per_tenant},
    }
