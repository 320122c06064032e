"""Shared types."""

from __future__ import annotations

from dataclasses import dataclass

ADMIN_SCOPE = "substrate:admin"


@dataclass(frozen=True)
class Principal:
    """Who is calling: from the bearer token (or open mode on loopback)."""

    tenant_id: str
    subject: str
    scopes: frozenset[str]
    open_mode: bool = False
    legacy: bool = False

    @property
    def is_admin(self) -> bool:
        return ADMIN_SCOPE in self.scopes

    @property
    def read_tenant(self) -> str | None:
        """The tenant that scopes this principal's reads; None (every tenant) for admins."""
        return None if self.is_admin else self.tenant_id
