"""The limits in scope of each spender, kept per worker process while the limits' generation
(apps.budgets.models.LimitsGeneration) stands still, so a gate whose run's claim read the same
generation skips the limits read: with no limit in scope, the gate makes no query at all.

Exact as the read it replaces: the claim reads the generation in its snapshot, and an entry
cached under generation g was read after a claim saw g, so it is at least as new as g's limits
(a newer claim sees another generation and reads again). A limit written after the claim
applies from the run's next iteration, as one written just after today's read would."""

from __future__ import annotations

import threading

from apps.budgets import hot
from apps.budgets.models import TokenLimit
from apps.core.spend import Spender

MAX_SPENDERS = 10_000  # beyond this many spenders in one generation the cache starts again

_lock = threading.Lock()
_generation: int | None = None
_by_spender: dict[Spender, list[TokenLimit]] = {}


def limits_at(spender: Spender, generation: int | None) -> list[TokenLimit]:
    """`spender`'s limits (read-only: shared between threads); `generation` None reads them."""
    global _generation
    if generation is not None:
        with _lock:
            if _generation == generation and (found := _by_spender.get(spender)) is not None:
                return found
    limits = hot.limits_of(spender.tenant_id, spender.user_id, spender.agent)
    if generation is not None:
        with _lock:
            if _generation != generation or len(_by_spender) >= MAX_SPENDERS:
                _generation = generation
                _by_spender.clear()
            _by_spender[spender] = limits
    return limits
