"""Shared types."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    """Who is calling: from the bearer token (or open mode on loopback)."""

    tenant_id: str
    subject: str
    scopes: frozenset[str]
    open_mode: bool = False
