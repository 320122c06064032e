"""Timestamps on the wire: RFC 3339 in UTC with a `Z` suffix, as loomcycle writes them."""

from __future__ import annotations

from datetime import datetime


def iso_z(value: datetime) -> str:
    """`2026-11-24T09:00:00.123456Z` for an aware UTC datetime."""
    return value.isoformat().replace("+00:00", "Z")


def ts(value: datetime | None) -> str | None:
    """`iso_z`, or None for a missing timestamp (a run not yet completed)."""
    return iso_z(value) if value else None
