"""Whose identity a write carries (SPEC 8, tenant rules): the token's, not the wire's.

A principal from a tenant token acts as its own tenant and subject: a
`tenant_id` or `user_id` in the request that differs is overridden and logged
`identity_overridden`, so a tenant token cannot start runs or gateway calls
as another user. Who may name the user: open mode, the legacy token and
admins (the operator), and a token an admin granted `runs:act-as-user` (an
application backend acting for its end users, within its own tenant). An
isolated member (`substrate:user`) is always itself, whatever it holds.
"""

from __future__ import annotations

import logging

from apps.core.types import Principal

log = logging.getLogger("loomcycle.auth")

ACT_AS_USER_SCOPE = "runs:act-as-user"


def may_name_user(principal: Principal) -> bool:
    if principal.isolated:
        return False
    return principal.open_mode or principal.legacy or principal.is_admin or ACT_AS_USER_SCOPE in principal.scopes


def acting_user_id(principal: Principal, wire: str | None) -> str:
    """The user a write by `principal` acts as, given the request's `user_id`."""
    if may_name_user(principal):
        return wire or ""
    if wire and wire != principal.subject:
        who = (wire, principal.subject, principal.tenant_id)
        log.info("identity_overridden kind=subject wire=%r principal=%r tenant=%r", *who)
    return principal.subject


def acting_tenant_id(principal: Principal, wire: str | None) -> str:
    """The tenant a write acts in: always the principal's; a differing wire claim is logged."""
    if wire and wire != principal.tenant_id and not principal.open_mode:
        who = (wire, principal.tenant_id, principal.subject)
        log.info("identity_overridden kind=tenant wire=%r principal=%r subject=%r", *who)
    return principal.tenant_id
