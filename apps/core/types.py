"""Shared types."""

from __future__ import annotations

from dataclasses import dataclass

from apps.core.scopes import ADMIN, OPERATOR_KEY, has_scope, isolated_scopes


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
        return ADMIN in self.scopes

    @property
    def may_spend_operator_keys(self) -> bool:
        """SPEC 2.1: providers:operator-key, held or implied (apps.core.scopes: tenant and admin imply it)."""
        return has_scope(self.scopes, OPERATOR_KEY)

    @property
    def isolated(self) -> bool:
        """An isolated member (substrate:user without tenant/admin) acts only as its own user."""
        return isolated_scopes(self.scopes)

    @property
    def read_user(self) -> str | None:
        """The user that scopes this principal's run reads; None (any user) unless isolated."""
        return self.subject if self.isolated else None

    @property
    def read_tenant(self) -> str | None:
        """The tenant that scopes this principal's reads; None (every tenant) for admins."""
        return None if self.is_admin else self.tenant_id
