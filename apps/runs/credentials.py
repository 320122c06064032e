"""Per-run credentials (`user_bearer`, `user_credentials`; SPEC 2.3, 8): checked,
sealed at rest on the run row, opened only by the worker building a ToolContext.

A run's iterations run on any worker, so the values must outlive the request
that brought them; they are kept on the run row ENCRYPTED (AES-256-GCM, an
authenticated cipher) and the terminal commit clears the column. Invariants:
- the key is derived (HKDF-SHA256) from Django's SECRET_KEY, the instance
  secret every process of a deployment already shares; a database dump alone
  opens nothing;
- the run id is the associated data: a sealed blob copied onto another run
  does not open there;
- nothing here logs, raises or returns a value: errors name the field only.

A credential value shorter than MIN_SECRET_LEN is refused: redaction
(apps.core.redact) could not mask it without masking ordinary text, so it
could reach a stored transcript in clear. A value that is not a valid HTTP
header value (HEADER_VALUE_RE: printable ASCII, inner spaces and tabs, no
control character) is refused too: credentials only ever go into headers, and
an HTTP library refusing one would quote it escaped in its error.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import os
import re
from collections.abc import Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from apps.core.errors import Invalid
from apps.core.redact import MIN_SECRET_LEN, Redactor, run_redactor

BEARER_KEY = "user_bearer"  # the ToolContext.credentials key of user_bearer
BEARER_RE = re.compile(r"[A-Za-z0-9._\-+/=]{16,512}")  # SPEC 2.3
NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # SPEC 2.3
MAX_CREDENTIALS = 32
MAX_VALUE_CHARS = 8192
_VERSION = b"\x01"
_NONCE_BYTES = 12
_HKDF_INFO = b"loomcycle run credentials v1"
CODE = "invalid_credentials"
# RFC 9110 field-value, ASCII only: visible characters with inner spaces or tabs.
HEADER_VALUE_RE = re.compile(r"[\x21-\x7e](?:[\t\x20-\x7e]*[\x21-\x7e])?")

log = logging.getLogger("loomcycle.credentials")


def credentials_from_wire(*, user_bearer: object, user_credentials: Mapping[str, object] | None) -> dict[str, str]:
    """The request fields `user_bearer` and `user_credentials` as one mapping
    (ToolContext.credentials' form: the bearer under BEARER_KEY), checked."""
    creds: dict[str, object] = dict(user_credentials or {})
    if BEARER_KEY in creds:
        raise Invalid(f"user_credentials: the name {BEARER_KEY!r} is reserved for the user_bearer field", code=CODE)
    if user_bearer is not None:
        creds[BEARER_KEY] = user_bearer
    return credentials_check(creds)


def credentials_check(credentials: Mapping[str, object] | None) -> dict[str, str]:
    """A run's credentials ({name: value}, the bearer under BEARER_KEY) as a
    plain dict; Invalid (400 `invalid_credentials`) for a bad name, size or
    shape. Messages never quote a value."""
    creds = dict(credentials or {})
    if len(creds) - (BEARER_KEY in creds) > MAX_CREDENTIALS:  # the bearer is not counted
        raise Invalid(f"user_credentials: at most {MAX_CREDENTIALS} entries", code=CODE)
    out: dict[str, str] = {}
    for name, value in creds.items():
        if name == BEARER_KEY:
            if not isinstance(value, str) or not BEARER_RE.fullmatch(value):
                raise Invalid("user_bearer must match [A-Za-z0-9._-+/=]{16,512}", code=CODE)
        else:
            _check_one(name, value)
        out[name] = str(value)
    return out


def _check_one(name: object, value: object) -> None:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise Invalid("user_credentials: each name must match [a-zA-Z0-9_-]{1,64}", code=CODE)
    if not isinstance(value, str):
        raise Invalid(f"user_credentials.{name}: the value must be a string", code=CODE)
    if not MIN_SECRET_LEN <= len(value) <= MAX_VALUE_CHARS:
        raise Invalid(
            f"user_credentials.{name}: the value must be {MIN_SECRET_LEN}..{MAX_VALUE_CHARS} characters "
            "(a shorter secret cannot be redacted reliably)",
            code=CODE,
        )
    if not HEADER_VALUE_RE.fullmatch(value):
        raise Invalid(
            f"user_credentials.{name}: the value must be a valid HTTP header value "
            "(printable ASCII, no control characters, no leading or trailing whitespace)",
            code=CODE,
        )


@functools.cache
def _cipher(secret_key: str) -> AESGCM:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO)
    return AESGCM(hkdf.derive(secret_key.encode()))


def seal(*, run_id: str, credentials: Mapping[str, str]) -> str:
    """The credentials encrypted for `run_id` (text for the run row); "" for none."""
    if not credentials:
        return ""
    nonce = os.urandom(_NONCE_BYTES)
    plain = json.dumps(dict(credentials), separators=(",", ":")).encode()
    sealed = _cipher(str(settings.SECRET_KEY)).encrypt(nonce, plain, run_id.encode())
    return base64.urlsafe_b64encode(_VERSION + nonce + sealed).decode()


class CredentialsUnreadable(Exception):
    """A sealed value that does not open (another key, another run, tampered)."""


def unseal(*, run_id: str, sealed: str) -> dict[str, str]:
    """The credentials `seal` sealed for `run_id`; {} for ""."""
    if not sealed:
        return {}
    try:
        raw = base64.urlsafe_b64decode(sealed.encode())
        if raw[:1] != _VERSION:
            raise CredentialsUnreadable("unknown sealed-credentials version")
        nonce, body = raw[1 : 1 + _NONCE_BYTES], raw[1 + _NONCE_BYTES :]
        plain = _cipher(str(settings.SECRET_KEY)).decrypt(nonce, body, run_id.encode())
    except (InvalidTag, ValueError) as exc:
        raise CredentialsUnreadable(
            "the run's credentials do not open with this process's key (DJANGO_SECRET_KEY differs?)"
        ) from exc
    data = json.loads(plain)
    return {str(k): str(v) for k, v in data.items()}


def run_redactor_of(*, run_id: str, sealed: str) -> Redactor:
    """The redactor of a run whose sealed credentials are `sealed`, for the web
    paths (cancel, input, answers). When they do not open in this process the
    runtime redactor stands in and a warning names the run (never a value):
    cancel and input keep working, and the worker, which cannot open them
    either, fails the run with the reason (apps.runs.engine)."""
    try:
        return run_redactor(unseal(run_id=run_id, sealed=sealed))
    except CredentialsUnreadable as exc:
        log.warning("run %s: credentials unreadable here (%s); redacting with the runtime secrets only", run_id, exc)
        return run_redactor({})
