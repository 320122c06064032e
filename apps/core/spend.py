"""The spend gate: where the runs engine and the gateway ask whether tokens may
be spent, and report what was (issue 37). apps.budgets installs the guard at
ready(); with none installed every call is allowed and nothing is counted.

It lives in the floor because both sides that spend (apps.runs, apps.gateway)
ask it, and the gateway knows nothing of the apps above it. Calls are small:
`admit` before a run is inserted, `hold` before each provider call, `settle`
after the call's usage is known (a run's step from the ledger it committed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from apps.core.errors import QuotaExhausted


@dataclass(frozen=True)
class Spender:
    """Whose budget a call spends: a run's (children carry their root's tenant and user) or a gateway caller's."""

    tenant_id: str
    user_id: str
    agent: str = ""  # the agent name; "" for a gateway call


@dataclass(frozen=True)
class Crossing:
    """One limit at or over a threshold: SPEC 3.3 `limit{scope,scope_id,severity,window,used,limit,message}`."""

    limit_id: int
    scope: str
    scope_id: str
    severity: str  # soft | hard
    window: str
    kind: str
    used: str  # a number as text: tokens, or USD for cost limits
    limit: str
    message: str
    on_exceed: str = "refuse"  # refuse | defer
    resume_at: datetime | None = None  # when the window resets (defer)

    def event(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "scope": self.scope,
            "scope_id": self.scope_id,
            "severity": self.severity,
            "window": self.window,
        }
        info |= {"kind": self.kind, "used": _num(self.used), "limit": _num(self.limit), "message": self.message}
        return {"type": "limit", "limit": info}

    def details(self) -> dict[str, Any]:
        """The 429 `token_limit_exceeded` details (SPEC 2.6)."""
        out = {k: v for k, v in self.event()["limit"].items() if k != "severity"}
        if self.resume_at is not None:
            out["resume_at"] = self.resume_at.isoformat()
        return out


def _num(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() else value


@dataclass
class Verdict:
    """What a check found: `hard` set = refused (the first hard limit reached); `soft` the soft limits reached."""

    hard: Crossing | None = None
    soft: list[Crossing] = field(default_factory=list)
    held: bool = False  # limits were in scope: the call's holds (or a refused run) want settling

    @property
    def allowed(self) -> bool:
        return self.hard is None


class Guard(Protocol):
    def admit(self, spender: Spender) -> Verdict: ...

    def hold(self, *, key: str, step: int | None, spender: Spender, generation: int | None = None) -> Verdict: ...

    def settle_run(self, *, run_id: str) -> None: ...

    def settle_call(self, *, key: str, usage: dict[str, Any], cost_usd: str | None) -> None: ...

    def notices(self, *, run_id: str, crossings: list[Crossing]) -> list[Crossing]: ...


# The limits' generation, read by the run's claim (apps.runs.store.hot) in its own snapshot and
# handed to `hold`: unchanged since the guard last read the limits, it need not read them again.
# apps.budgets owns the table (a statement trigger moves `n` on every limit write); no row = 0.
LIMITS_GENERATION_SQL = "COALESCE((SELECT n FROM budgets_limitsgeneration WHERE id = 1), 0)"

_GUARD: list[Guard] = []


def install(guard: Guard) -> None:
    """apps.budgets.apps: the one guard (a second install replaces the first)."""
    _GUARD[:] = [guard]


def guard() -> Guard | None:
    return _GUARD[0] if _GUARD else None


class TokenLimitExceeded(QuotaExhausted):
    """429 `token_limit_exceeded` (SPEC 2.6), details `{scope, scope_id, used, limit, window, message}`."""

    code = "token_limit_exceeded"


def admit_or_raise(spender: Spender, *, defer: bool = False) -> Verdict:
    """At admission: raise 429 when a hard limit refuses; a defer verdict is returned (the caller
    parks). `defer`: every hard limit defers (a schedule's fire waits for its budget, never fails)."""
    g = guard()
    if g is None:
        return Verdict()
    verdict = g.admit(spender)
    if verdict.hard is not None and not defer and verdict.hard.on_exceed != "defer":
        raise TokenLimitExceeded(
            verdict.hard.message, details=verdict.hard.details(), headers=retry_after(verdict.hard)
        )
    return verdict


def retry_after(crossing: Crossing) -> dict[str, str]:
    """`Retry-After`: the seconds until the limit's window resets (none when unknown)."""
    if crossing.resume_at is None:
        return {}
    seconds = (crossing.resume_at - datetime.now(UTC)).total_seconds()
    return {"Retry-After": str(max(1, math.ceil(seconds)))}
