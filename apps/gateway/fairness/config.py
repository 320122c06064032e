"""Fairness knobs and gates: which capped counters a run, a gateway call or a
provider call counts against, and the 429 each one answers when full."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps.core.config import runtime_config
from apps.core.errors import ApplicationError, Invalid, QuotaExhausted
from apps.gateway.providers import get_provider
from apps.gateway.providers.http import HttpProvider

PREFIX = "lc:fair:"
USER_KEY, TENANT_KEY, PROVIDER_KEY, WAITING_KEY, STREAM_KEY = (PREFIX + s for s in ("u:", "t:", "p:", "pw:", "s:"))
RUNS_KEY, INDEX_KEY = PREFIX + "runs", PREFIX + "keys"
RETRY_AFTER = {"Retry-After": "5"}


class SlotRefused(QuotaExhausted):
    """429 in loomcycle's shape: `code`, `error` and the details at the top
    level (`user_id`/`tenant_id`/`provider`, `cap`), plus our `details`."""

    def body(self) -> dict[str, Any]:
        return {**super().body(), **self.details}


class FairnessUnavailable(ApplicationError):
    status, code = 503, "store_unavailable"


@dataclass(frozen=True)
class Caps:
    per_user: int
    per_tenant: int
    provider_queue_timeout_ms: int


def _knob(block: dict[str, Any], name: str, default: int) -> int:
    value = block.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit():  # `${ENV}` expansion yields strings
        return int(value)
    raise Invalid(f"concurrency.{name} must be a non-negative integer, not {value!r}", code="config_invalid")


def _block() -> dict[str, Any]:
    block = runtime_config().get("concurrency") or {}
    if not isinstance(block, dict):
        raise Invalid("concurrency: must be a mapping", code="config_invalid")
    return block


def concurrency_knob(name: str, default: int) -> int:
    """One knob of yaml `concurrency:` when it is set, else `default` (its settings.LOOMCYCLE field)."""
    return _knob(_block(), name, default)


def caps() -> Caps:
    """yaml `concurrency:` when it sets a knob, else settings.LOOMCYCLE (from LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_USER,
    LOOMCYCLE_MAX_CONCURRENT_RUNS_PER_TENANT, LOOMCYCLE_PROVIDER_QUEUE_TIMEOUT_MS)."""
    block, conf = _block(), settings.LOOMCYCLE
    return Caps(
        per_user=_knob(block, "max_concurrent_runs_per_user", conf.max_concurrent_runs_per_user),
        per_tenant=_knob(block, "max_concurrent_runs_per_tenant", conf.max_concurrent_runs_per_tenant),
        provider_queue_timeout_ms=_knob(block, "provider_queue_timeout_ms", conf.provider_queue_timeout_ms),
    )


_REFUSALS = {
    "user": ("user_id", "per_user_quota_exhausted", "per-user quota exhausted: user={} cap={}"),
    "tenant": ("tenant_id", "per_tenant_quota_exhausted", "per-tenant quota exhausted: tenant={} cap={}"),
    "provider": ("provider", "provider_concurrency_exhausted", "provider concurrency exhausted: provider={} cap={}"),
    "stream": ("principal", "stream_limit_exceeded", "too many open event streams: principal={} cap={}"),
}


@dataclass(frozen=True)
class Gate:
    """One capped counter: a sorted set and its cap."""

    key: str
    cap: int
    kind: str  # user | tenant | provider | stream
    name: str

    def refused(self) -> SlotRefused:
        field, code, message = _REFUSALS[self.kind]
        details = {field: self.name, "cap": self.cap}
        return SlotRefused(message.format(self.name, self.cap), code=code, details=details, headers=RETRY_AFTER)


def user_gates(tenant_id: str, user_id: str) -> list[Gate]:
    """The counters a run or gateway call of (tenant, user) counts against; empty when both caps are 0."""
    c = caps()
    gates = []
    if c.per_user > 0 and user_id:  # an empty user_id is not capped per user
        gates.append(Gate(f"{USER_KEY}{tenant_id}/{user_id}", c.per_user, "user", user_id))
    if c.per_tenant > 0:
        gates.append(Gate(f"{TENANT_KEY}{tenant_id}", c.per_tenant, "tenant", tenant_id))
    return gates


def provider_cap(provider_id: str) -> int:
    """The provider's `max_concurrent` (yaml `providers:`); 0 = not gated."""
    provider = get_provider(provider_id)
    return provider.config.max_concurrent if isinstance(provider, HttpProvider) else 0


def provider_gate(provider_id: str, cap: int | None = None) -> Gate | None:
    cap = provider_cap(provider_id) if cap is None else cap
    return Gate(PROVIDER_KEY + provider_id, cap, "provider", provider_id) if cap > 0 else None
