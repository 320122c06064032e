"""The one module a Django app extending the runtime imports (docs/extending.md).

    from loomcycle_project.extend import RunContext, ToolError, run_create, signals, tool

What is here is the stable surface; everything it re-exports may move inside
`apps/` without user code noticing. It lives in `loomcycle_project` (the layer
above the apps) so that it can gather the pieces of several apps without one app
importing another, and because user apps are installed beside it by
LOOMCYCLE_EXTRA_APPS.

- `tool`: a decorator turning a typed function into an agent tool (apps.runs.hosttools).
- `run_create`: start a run from Python, inside the caller's transaction if one is open:
  the run exists iff that transaction commits (its doorbell rings on commit; a
  rollback leaves no row, no event, no doorbell and no fairness slot).
- `signals`: the run lifecycle signals (apps.runs.signals), sent after commit, at least once
  (through an outbox: a receiver may see a transition twice and dedupes on `delivery_id`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from apps.core.identity import ACT_AS_USER_SCOPE
from apps.core.types import Principal
from apps.runs import services as _services
from apps.runs import signals
from apps.runs.hosttools import HostTool, RunContext, ToolError, tool
from apps.runs.models import Run
from apps.runs.prompt import Segment

__all__ = ["HostTool", "Run", "RunContext", "ToolError", "run_create", "signals", "tool"]


def run_create(
    *,
    agent: str,
    prompt: str,
    tenant_id: str = "",
    user_id: str = "",
    metadata: dict[str, Any] | None = None,
    tools: list[str] | None = None,
    credentials: Mapping[str, str] | None = None,
) -> Run:
    """Create a run of `agent` (resolved in `tenant_id`) for `user_id`, as the deployment
    itself: no token, so no scope check. Raises what the API would answer with a 4xx
    (apps.core.errors: Invalid for an unknown agent, QuotaExhausted over a fairness cap,
    RuntimePaused, Conflict). Inside `transaction.atomic()` the run is created with that
    transaction: nothing of it is visible, and no worker starts it, until it commits."""
    principal = Principal(tenant_id=tenant_id, subject="python", scopes=frozenset({ACT_AS_USER_SCOPE}))
    data = _services.RunCreate(
        agent=agent,
        segments=[Segment(text=prompt)],
        user_id=user_id,
        metadata=metadata,
        tools=tools,
        credentials=dict(credentials or {}),
    )
    return _services.run_create(principal=principal, data=data)
