"""Cursor-paginated run reads (GET /v1/runs, GET /v1/runs/{id}/children, ListChildRuns).

A page is ordered newest first by (created_at, id) and continues from an opaque cursor that
carries the last row's pair (keyset pagination): a page costs one index range scan whatever its
depth, and a run created while a client pages through never shifts or repeats a row. There is
no total cap: a client pages until `next_cursor` is "". Filters are tenant-scoped like every
read here (`tenant_id` None only for an admin), and an isolated member sees only its own runs.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q, QuerySet

from apps.core.errors import Invalid
from apps.runs.models import PARKED, RUNNABLE, Run

MAX_LIMIT = 1000
DEFAULT_LIMIT = 100


@dataclass(frozen=True)
class Page:
    rows: list[Run]
    next_cursor: str  # "" on the last page


@dataclass(frozen=True)
class RunFilter:
    """What GET /v1/runs narrows by; every field optional."""

    status: str = "running"
    agent: str = ""
    user_id: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    created_after: datetime | None = None
    created_before: datetime | None = None
    parent_id: str | None = None  # a run's direct children only


def cursor_encode(created_at: datetime, row_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), row_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cursor_decode(cursor: str) -> tuple[datetime, str]:
    """The (created_at, id) a cursor carries; Invalid `invalid_cursor` for anything else."""
    try:
        stamp, row_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        return datetime.fromisoformat(stamp), str(row_id)
    except (ValueError, TypeError, binascii.Error) as exc:
        raise Invalid("cursor is not one this server issued", code="invalid_cursor") from exc


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise Invalid(f"limit must be between 1 and {MAX_LIMIT}", code="invalid_limit")
    return limit


def with_status(qs: QuerySet[Run], status: str) -> QuerySet[Run]:
    """`running` = every live state (loomcycle's "running"), `all` = no filter, else a
    comma-separated list of states (`running` in it also meaning every live state)."""
    if status == "all":
        return qs
    wanted: set[str] = set()
    for item in (s.strip() for s in status.split(",")):
        wanted.update([*RUNNABLE, *PARKED] if item == "running" else [item])
    return qs.filter(status__in=wanted)


def _filtered(qs: QuerySet[Run], f: RunFilter) -> QuerySet[Run]:
    if f.agent:
        qs = qs.filter(agent_name=f.agent)
    if f.user_id:
        qs = qs.filter(user_id=f.user_id)
    if f.metadata:
        qs = qs.filter(metadata__contains=f.metadata)  # JSONB @>: every given key has the given value
    if f.created_after is not None:
        qs = qs.filter(created_at__gt=f.created_after)
    if f.created_before is not None:
        qs = qs.filter(created_at__lt=f.created_before)
    if f.parent_id is not None:
        qs = qs.filter(parent_id=f.parent_id)
    return with_status(qs, f.status)


def runs_page(
    *, tenant_id: str | None, reader: str | None, f: RunFilter, limit: int = DEFAULT_LIMIT, cursor: str = ""
) -> Page:
    """One page of the runs the principal may see, newest first (module docstring)."""
    qs = Run.objects.select_related("parent", "resident")
    if tenant_id is not None:
        qs = qs.filter(tenant_id=tenant_id)
    if reader is not None:
        qs = qs.filter(user_id=reader)
    qs = _filtered(qs, f)
    if cursor:
        at, row_id = cursor_decode(cursor)
        qs = qs.filter(Q(created_at__lt=at) | Q(created_at=at, id__lt=row_id))
    rows = list(qs.order_by("-created_at", "-id")[: check_limit(limit) + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, cursor_encode(rows[-1].created_at, rows[-1].id) if more else "")
