"""The scope names of SPEC 2.1 and what each implies: the one table every
gate reads (apps.substrate.auth for routes, `Principal.may_spend_operator_keys`
for the gateway's operator-key restriction). Here because apps.core imports no
other app, and both need it."""

from __future__ import annotations

ADMIN = "substrate:admin"
TENANT = "substrate:tenant"
USER = "substrate:user"
RUNS_CREATE = "runs:create"
RUNS_READ = "runs:read"
RUNS_DELETE = "runs:delete"  # DELETE /v1/runs/{id}: a tenant operator holds it, a member only if minted with it
CHANNEL_PUBLISH = "channel:publish"
CHANNEL_READ = "channel:read"
OPERATOR_KEY = "providers:operator-key"
ANY = ""  # any authenticated principal

TENANT_IMPLIES = frozenset({TENANT, RUNS_CREATE, RUNS_READ, RUNS_DELETE, CHANNEL_PUBLISH, CHANNEL_READ, OPERATOR_KEY})
USER_IMPLIES = frozenset({USER, RUNS_CREATE, RUNS_READ})


def has_scope(scopes: frozenset[str], want: str) -> bool:
    """`want` is held, or implied (admin implies every scope; tenant and user imply their tables)."""
    if not want or want in scopes or ADMIN in scopes:
        return True
    return (TENANT in scopes and want in TENANT_IMPLIES) or (USER in scopes and want in USER_IMPLIES)


def isolated_scopes(scopes: frozenset[str]) -> bool:
    """An isolated member tops out at substrate:user (neither tenant nor admin)."""
    return USER in scopes and TENANT not in scopes and ADMIN not in scopes
