"""Operator tokens (SPEC 5.2 OperatorTokenDef, 8): mint, rotate, retire, read.

Invariants:
- a token is `lct_<base58 of 32 random bytes>`; only `hex(sha256(pepper || token))`
  is stored, never the plaintext, which is returned once by create/rotate;
- at most one live token (retired_at IS NULL) per name: token writes are
  serialised by one transaction-scoped advisory lock, and a partial unique
  index (migration 0003) backs that up;
- a rotated token stays valid until `retired_at` (now + grace), then 401s;
- the last live admin token cannot be retired while no LOOMCYCLE_AUTH_TOKEN is
  configured (that would reopen the runtime or lock the operator out);
- every create/rotate/retire appends one JSON line to the audit log inside the
  transaction (an unwritable log fails the op), never with the secret or hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.core.ids import is_ident, new_def_id
from apps.substrate import auth_cache
from apps.substrate.kinds import Refused
from apps.substrate.models import OperatorTokenDef

TOOL = "OperatorTokenDef"
PREFIX = "lct_"
SUFFIX_LEN = 6
ADMIN_SCOPE = "substrate:admin"
SCOPE_CATALOG = frozenset(
    "substrate:admin substrate:tenant substrate:user runs:create runs:read runs:act-as-user "
    "channel:publish channel:read providers:operator-key".split()
)
MAX_SCOPES = 64
OPS = ("create", "rotate", "retire", "get", "list")
SHOWN_ONCE = "store this token now: it is shown once and cannot be retrieved again"
_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_IMPORT_RE = re.compile(r"[\x21-\x7e]{8,512}")  # printable ASCII, no whitespace
_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"
_LOCK_KEY = "loomcycle:operator_tokens"


class AuditLogUnavailable(ApplicationError):
    status, code = 503, "audit_log_unavailable"


# --- minting and hashing ----------------------------------------------------------


def base58(raw: bytes) -> str:
    """Bitcoin-alphabet base58 (leading zero bytes become '1')."""
    number = int.from_bytes(raw, "big")
    out = ""
    while number:
        number, rem = divmod(number, 58)
        out = _B58[rem] + out
    zeros = len(raw) - len(raw.lstrip(b"\0"))
    return "1" * zeros + out


def mint_token() -> tuple[str, str]:
    """A fresh token and its suffix (the first 6 characters of the body)."""
    body = base58(secrets.token_bytes(32))
    return PREFIX + body, body[:SUFFIX_LEN]


def token_hash(token: str) -> str:
    """hex(sha256(pepper || token)), no prefix (SPEC appendix E)."""
    return hashlib.sha256((settings.LOOMCYCLE.operator_token_pepper + token).encode()).hexdigest()


def _suffix_of(token: str) -> str:
    return token.removeprefix(PREFIX)[:SUFFIX_LEN]


# --- reads --------------------------------------------------------------------------


def _valid_at(now: datetime) -> Q:
    return Q(retired_at__isnull=True) | Q(retired_at__gt=now)


def valid_tokens(now: datetime | None = None) -> QuerySet[OperatorTokenDef]:
    """Tokens that authenticate right now (live, or inside a rotation grace)."""
    return OperatorTokenDef.objects.filter(_valid_at(now or timezone.now()))


def live_admin_token_exists() -> bool:
    """Any admin-scoped token that authenticates now: it disables the legacy token."""
    return valid_tokens().filter(scopes__contains=[ADMIN_SCOPE]).exists()


def live_token_exists() -> bool:
    """Any token that authenticates now, of any scope: it ends open mode (apps.substrate.openmode)."""
    return valid_tokens().exists()


def token_by_hash(digest: str) -> OperatorTokenDef | None:
    return OperatorTokenDef.objects.filter(token_hash=digest).first()


def _ts(value: datetime | None) -> str | None:
    if value is None:
        return None
    value = value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond * 1000:09d}Z"


def token_out(row: OperatorTokenDef, now: datetime | None = None) -> dict[str, Any]:
    """A token row for output: never the hash, never the plaintext."""
    now = now or timezone.now()
    state = "live" if row.retired_at is None else "rotating" if row.retired_at > now else "retired"
    return {
        "def_id": row.id,
        "name": row.name,
        "tenant_id": row.tenant_id,
        "subject": row.subject,
        "scopes": list(row.scopes),
        "token_suffix": row.token_suffix,
        "imported": row.imported,
        "rotated_from": row.rotated_from_id,
        "created_at": _ts(row.created_at),
        "created_by": row.created_by,
        "retired_at": _ts(row.retired_at),
        "state": state,
    }


def token_get(*, def_id: Any) -> dict[str, Any]:
    row = OperatorTokenDef.objects.filter(id=_def_id(def_id)).first()
    if row is None:
        raise Refused(f"no operator token with def_id {def_id!r}")
    return token_out(row)


def token_list(*, name: Any = None) -> dict[str, Any]:
    rows = OperatorTokenDef.objects.order_by("name", "-created_at")
    if name is not None and name != "":
        rows = rows.filter(name=_name(name))
    now = timezone.now()
    return {"name": name or "", "tokens": [token_out(row, now) for row in rows]}


def token_names() -> list[dict[str, Any]]:
    """`GET /v1/_operatortokendef/names`: one summary per name, in the def kinds' shape."""
    now = timezone.now()
    by_name: dict[str, list[OperatorTokenDef]] = {}
    for row in OperatorTokenDef.objects.order_by("name", "created_at"):
        by_name.setdefault(row.name, []).append(row)
    out: list[dict[str, Any]] = []
    for name, rows in by_name.items():
        live = next((r for r in reversed(rows) if r.retired_at is None), None)
        out.append(
            {
                "name": name,
                "tenant_id": rows[-1].tenant_id,
                "version_count": len(rows),
                "active_def_id": live.id if live else "",
                "latest_version": len(rows),
                "last_updated": _ts(rows[-1].created_at),
                "live_version_count": sum(1 for r in rows if r.retired_at is None or r.retired_at > now),
                "active_retired": live is None,
            }
        )
    return out


# --- validation ------------------------------------------------------------------------


def _name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise Refused("name is required and must match [a-zA-Z0-9_-]{1,64}")
    return value


def _def_id(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise Refused("def_id is required")
    return value


def _tenant(value: Any) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise Refused("tenant_id is required and must match [a-zA-Z0-9_-]{1,64}")
    return value


def _subject(value: Any, name: str) -> str:
    if value is None or value == "":
        return f"tok-{name}"
    if not isinstance(value, str) or not is_ident(value):
        raise Refused("subject must match [A-Za-z0-9_-]{1,128}")
    return value


def check_scopes(value: Any) -> list[str]:
    """The closed catalogue, at most 64, duplicates dropped; default [substrate:admin]."""
    if value is None:
        return [ADMIN_SCOPE]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise Refused("scopes must be a list of strings")
    scopes = list(dict.fromkeys(value))
    if not scopes:
        raise Refused("scopes must name at least one scope (omit it for [substrate:admin])")
    if len(scopes) > MAX_SCOPES:
        raise Refused(f"at most {MAX_SCOPES} scopes")
    unknown = [s for s in scopes if s not in SCOPE_CATALOG]
    if unknown:
        raise Refused(f"unknown scope(s) {', '.join(unknown)}; known: {', '.join(sorted(SCOPE_CATALOG))}")
    return scopes


def _grace(value: Any) -> int:
    if value is None:
        return int(settings.LOOMCYCLE.operator_token_rotation_grace_seconds)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Refused("grace_seconds must be a non-negative integer")
    return value


# --- writes -------------------------------------------------------------------------------


def _lock() -> None:
    # One lock for every token write: "one live token per name" and "never retire
    # the last admin token" are both decided on rows another writer could change.
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [_LOCK_KEY])


def _audit(op: str, row: OperatorTokenDef, by: str, **extra: Any) -> None:
    """Append one JSON line. Inside the transaction: if it cannot be written the op rolls back."""
    line = {
        "ts": _ts(timezone.now()),
        "kind": "operator_token",
        "op": op,
        "def_id": row.id,
        "name": row.name,
        "tenant_id": row.tenant_id,
        "subject": row.subject,
        "scopes": list(row.scopes),
        "token_suffix": row.token_suffix,
        "by": by,
        **extra,
    }
    path = Path(settings.LOOMCYCLE.audit_log_path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, separators=(",", ":"), sort_keys=True) + "\n")
    except OSError as exc:
        raise AuditLogUnavailable(f"cannot append to the audit log {path}: {exc.strerror or exc}") from exc
    auth_cache.forget_local()  # this process at once; every process once the write commits
    transaction.on_commit(auth_cache.bump)


def _live_by_name(name: str) -> OperatorTokenDef | None:
    return OperatorTokenDef.objects.filter(name=name, retired_at__isnull=True).first()


def _insert(**fields: Any) -> OperatorTokenDef:
    try:
        with transaction.atomic():  # savepoint: a unique violation must not poison the outer transaction
            return OperatorTokenDef.objects.create(id=new_def_id(), **fields)
    except IntegrityError as exc:
        if "token_hash" in str(exc):
            raise Refused("this token is already registered") from exc
        raise Refused(f"a live token named {fields['name']!r} already exists: use rotate") from exc


def _minted(row: OperatorTokenDef, token: str) -> dict[str, Any]:
    return {**token_out(row), "token": token, "warning": SHOWN_ONCE}


def token_create(
    *,
    name: Any,
    tenant_id: Any,
    subject: Any = None,
    scopes: Any = None,
    import_token: Any = None,
    by: str = "",
) -> dict[str, Any]:
    """Mint (or, with `import_token`, register) a token; the plaintext is in the result only."""
    name = _name(name)
    fields: dict[str, Any] = {
        "name": name,
        "tenant_id": _tenant(tenant_id),
        "subject": _subject(subject, name),
        "scopes": check_scopes(scopes),
        "created_by": by,
    }
    if import_token is not None:
        if not isinstance(import_token, str) or not _IMPORT_RE.fullmatch(import_token):
            raise Refused("import_token must be 8-512 printable characters without whitespace")
        token, suffix, fields["imported"] = import_token, _suffix_of(import_token), True
    else:
        token, suffix = mint_token()
    with transaction.atomic():
        _lock()
        if _live_by_name(name) is not None:
            raise Refused(f"a live token named {name!r} already exists: use rotate")
        row = _insert(token_hash=token_hash(token), token_suffix=suffix, **fields)
        _audit("create", row, by, imported=row.imported)
    return _minted(row, token)


def _target(name: Any, def_id: Any) -> OperatorTokenDef:
    """The row a rotate/retire addresses: by def_id, else the live token of `name`. Call under the lock."""
    if def_id is not None and def_id != "":
        row = OperatorTokenDef.objects.select_for_update().filter(id=_def_id(def_id)).first()
        if row is None:
            raise Refused(f"no operator token with def_id {def_id!r}")
        return row
    if name is None or name == "":
        raise Refused("name or def_id is required")
    row = OperatorTokenDef.objects.select_for_update().filter(name=_name(name), retired_at__isnull=True).first()
    if row is None:
        raise Refused(f"no live token named {name!r}")
    return row


def token_rotate(*, name: Any = None, def_id: Any = None, grace_seconds: Any = None, by: str = "") -> dict[str, Any]:
    """A new token with the same name, tenant, subject and scopes; the old one
    keeps working for `grace_seconds` (default LOOMCYCLE_OPERATOR_TOKEN_ROTATION_GRACE_SECONDS)."""
    grace = _grace(grace_seconds)
    token, suffix = mint_token()
    with transaction.atomic():
        _lock()
        old = _target(name, def_id)
        if old.retired_at is not None:
            raise Refused(f"token {old.id} is already retired or rotating: rotate the live token of {old.name!r}")
        now = timezone.now()
        old.retired_at = now + timedelta(seconds=grace)
        old.save(update_fields=["retired_at"])
        row = _insert(
            name=old.name,
            tenant_id=old.tenant_id,
            subject=old.subject,
            scopes=list(old.scopes),
            token_hash=token_hash(token),
            token_suffix=suffix,
            rotated_from=old,
            created_by=by,
        )
        prior = _ts(old.retired_at)
        _audit("rotate", row, by, rotated_from=old.id, prior_retires_at=prior)
    return {**_minted(row, token), "rotated_from": old.id, "prior_retires_at": prior}


def _is_admin(row: OperatorTokenDef) -> bool:
    return ADMIN_SCOPE in (row.scopes or [])


def token_retire(*, name: Any = None, def_id: Any = None, by: str = "") -> dict[str, Any]:
    """Retire now. Idempotent: an already-retired token is reported, not changed."""
    with transaction.atomic():
        _lock()
        row = _target(name, def_id)
        now = timezone.now()
        if row.retired_at is not None and row.retired_at <= now:
            return {**token_out(row, now), "retired": True, "already_retired": True}
        others = OperatorTokenDef.objects.filter(retired_at__isnull=True, scopes__contains=[ADMIN_SCOPE])
        if _is_admin(row) and not settings.LOOMCYCLE.auth_token and not others.exclude(id=row.id).exists():
            raise Refused(
                "refusing to retire the last live admin token while no LOOMCYCLE_AUTH_TOKEN is configured: "
                "mint another admin token (or rotate this one) first"
            )
        row.retired_at = now
        row.save(update_fields=["retired_at"])
        _audit("retire", row, by, retired_at=_ts(now))
    return {**token_out(row, now), "retired": True, "already_retired": False}


def token_dispatch(data: Any, *, by: str) -> dict[str, Any]:
    """The OperatorTokenDef tool's op-dispatch (REST `/v1/_operatortokendef`)."""
    if not isinstance(data, dict):
        raise Refused("input must be a JSON object")
    op = data.get("op")
    if op == "create":
        keys = ("name", "tenant_id", "subject", "scopes", "import_token")
        return token_create(**{k: data.get(k) for k in keys}, by=by)
    if op == "rotate":
        return token_rotate(
            name=data.get("name"), def_id=data.get("def_id"), grace_seconds=data.get("grace_seconds"), by=by
        )
    if op == "retire":
        return token_retire(name=data.get("name"), def_id=data.get("def_id"), by=by)
    if op == "get":
        return token_get(def_id=data.get("def_id"))
    if op == "list":
        return token_list(name=data.get("name"))
    raise Refused(f"unknown op {op!r}; one of: {', '.join(OPS)}")
