"""Verify-before-parse (SPEC 9.2 step 3): the raw body bytes against the
definition's `auth`, with secrets read from allowlisted environment names only.

Every comparison of a caller-supplied value with a secret or a MAC goes
through `hmac.compare_digest`. HMAC-SHA256 envelopes, one per definition
(`auth.format`):

- `github`: `sha256=<hex>` over the body;
- `hex`: bare `<hex>` over the body;
- `stripe`: `t=<unix>,v1=<hex>` over `"<t>." + body`, the timestamp within
  ±5 minutes;
- absent: `github` or `hex` (the same MAC over the body), never `stripe`.

What a MAC signs is the replay key (`signed_digest`): the delivery-id header
is outside every signature, so the receiver also dedupes on the digest of the
signed bytes, and a captured delivery re-sent with a fresh id is a replay.

Invariant: a definition never accepts a body-only MAC and a Stripe MAC
under one secret. A Stripe MAC is a MAC over `"<t>." + body`, so accepting
both would let a captured Stripe delivery of any age be re-sent as body
`"<t>." + body` with `sha256=<v1>` and skip the tolerance check.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings

from apps.core.secrets import credential_env_refusal, key_from_env
from apps.triggers.webhooks.errors import SecretUnresolvable, SignatureRefused, UnauthenticatedModeDisabled

STRIPE_TOLERANCE_S = 300
_STAMP_RE = re.compile(r"\d{1,12}", re.ASCII)  # with fullmatch: `²` and 4300-digit stamps are malformed, not a 500
DEFAULT_SIGNATURE_HEADERS = ("x-loomcycle-signature", "x-hub-signature-256")


class Check(enum.Enum):
    OK = "ok"
    MISSING = "signature header missing"
    MALFORMED = "signature header malformed"
    MISMATCH = "signature does not match"
    STALE = "signature timestamp outside the 5 minute tolerance"


def _mac(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def _stripe(secret: bytes, body: bytes, value: str, now: float) -> Check:
    parts = [p.split("=", 1) for p in value.split(",") if "=" in p]
    stamps = [v.strip() for k, v in parts if k.strip() == "t"]
    macs = [v.strip().lower() for k, v in parts if k.strip() == "v1"]
    if len(stamps) != 1 or not _STAMP_RE.fullmatch(stamps[0]) or not macs:
        return Check.MALFORMED
    if abs(now - int(stamps[0])) > STRIPE_TOLERANCE_S:
        return Check.STALE
    expected = _mac(secret, stamps[0].encode() + b"." + body)
    matched = [_same(expected, m) for m in macs]  # every candidate compared: no early exit on the first match
    return Check.OK if any(matched) else Check.MISMATCH


def check_hmac(
    secret: bytes, body: bytes, value: str | None, now: float | None = None, *, fmt: str | None = None
) -> Check:
    """The verdict on one signature header value (None: the header is absent)
    under the envelope `fmt` (see the module docstring)."""
    if value is None or not value.strip():
        return Check.MISSING
    value = value.strip()
    if fmt == "stripe":
        return _stripe(secret, body, value, time.time() if now is None else now)
    prefixed = value.lower().startswith("sha256=")
    if (fmt == "github" and not prefixed) or (fmt == "hex" and prefixed):
        return Check.MALFORMED
    if prefixed:
        value = value[len("sha256=") :]
    if not value or "=" in value or "," in value:  # e.g. a Stripe header on a body-MAC webhook
        return Check.MALFORMED
    return Check.OK if _same(_mac(secret, body), value.lower()) else Check.MISMATCH


def check_bearer(secret: str, value: str | None, *, scheme: bool) -> Check:
    """`Authorization: Bearer <secret>`, or the secret itself in a custom header."""
    if value is None or not value.strip():
        return Check.MISSING
    expected = f"Bearer {secret}" if scheme else secret
    return Check.OK if _same(expected, value.strip()) else Check.MISMATCH


def secret_env_allowed(name: str, *, owner: str) -> bool:
    """Never an infrastructure secret; for a shared webhook `LOOMCYCLE_*` or
    LOOMCYCLE_WEBHOOKS_ENV_ALLOWLIST, for a tenant's own (`owner`) only what
    LOOMCYCLE_TENANT_CREDENTIAL_ENV lists for it (another tenant's secret would let its
    signed deliveries start this tenant's runs)."""
    conf = settings.LOOMCYCLE
    refusal = credential_env_refusal(
        name, tenant_id=owner, tenant_allowlist=conf.tenant_credential_env, shared_allowlist=conf.webhooks_env_allowlist
    )
    return refusal is None


def resolve_secret(name: str, *, owner: str) -> str:
    """The secret's value; SecretUnresolvable when the name is not allowed or the variable is unset/empty."""
    if not secret_env_allowed(name, owner=owner):
        raise SecretUnresolvable("webhook secret is not resolvable").with_detail(
            f"secret env {name} is not allowlisted"
        )
    value = key_from_env(name)
    if not value:
        raise SecretUnresolvable("webhook secret is not resolvable").with_detail(f"secret env {name} is unset or empty")
    return value


def _signature_header(auth: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    names = (str(auth["header"]).lower(),) if auth.get("header") else DEFAULT_SIGNATURE_HEADERS
    return next((headers[n] for n in names if n in headers), None)


def signed_digest(auth: Mapping[str, Any], headers: Mapping[str, str], body: bytes) -> str:
    """The sha256 hex of what a verified HMAC signs (the body; `"<t>." + body` for
    Stripe), "" when nothing is signed (bearer, none). Call only after `verify`."""
    if auth.get("kind", "hmac") != "hmac":
        return ""
    signed = body
    if auth.get("format") == "stripe":
        parts = [p.split("=", 1) for p in (_signature_header(auth, headers) or "").split(",") if "=" in p]
        stamp = next(v.strip() for k, v in parts if k.strip() == "t")  # verify saw exactly one
        signed = stamp.encode() + b"." + body
    return hashlib.sha256(signed).hexdigest()


def verify(auth: Mapping[str, Any], headers: Mapping[str, str], body: bytes, *, owner: str) -> None:
    """Raise unless `body` is authentic under `auth` (headers lower-cased) of a webhook `owner` owns."""
    kind = auth.get("kind", "hmac")
    if kind == "none":
        if not settings.LOOMCYCLE.webhooks_allow_unauthenticated:
            raise UnauthenticatedModeDisabled("unauthenticated webhooks are disabled on this runtime")
        return
    if kind == "bearer":
        secret = resolve_secret(str(auth["bearer_token_env"]), owner=owner)
        custom = str(auth.get("header") or "").lower()
        result = check_bearer(secret, headers.get(custom or "authorization"), scheme=not custom)
    else:
        secret = resolve_secret(str(auth["signing_secret_env"]), owner=owner)
        value = _signature_header(auth, headers)
        result = check_hmac(secret.encode(), body, value, fmt=auth.get("format"))
    if result is not Check.OK:
        raise SignatureRefused("unauthorized").with_detail(result.value)
