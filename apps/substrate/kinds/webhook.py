"""WebhookDef (SPEC 5.2, 9.2): validation only; the receiver is not part of this module."""

from __future__ import annotations

import re
from typing import Any

from apps.substrate.kinds.base import Kind, Refused, drop_unknown
from apps.substrate.kinds.fields import (
    check_channel_name,
    get_env_name,
    get_flag,
    get_int,
    get_object,
    get_text,
    put,
)
from apps.substrate.kinds.triggers import TRIGGER_OPS, check_credentials, common_trigger_fields
from apps.substrate.models import WebhookDef, WebhookDefActive

WEBHOOK_FIELDS = frozenset(
    {
        "enabled",
        "delivery",
        "agent",
        "user_tier",
        "channel",
        "auth",
        "rate_limit",
        "body_size_limit_bytes",
        "payload_mapping",
        "user_credentials",
        "user_credentials_from_env",
        "metadata",
        "tenant_id",
        "sync_response",
        "on_complete",
    }
)
_AUTH_FIELDS = frozenset(
    {"kind", "algorithm", "format", "header", "signing_secret_env", "delivery_id_header", "bearer_token_env"}
)
# A mapping path: `$`, `.key`, `[index]` only. A key has no wildcard, filter or quoting
# characters, so `$.*`, `$..a` and `$[?(...)]` are refused (apps.triggers.webhooks.mapping parses it).
PATH_KEY = r"[^.\[\]*?@()'\"\s]+"
_JSON_PATH_RE = re.compile(rf"\$(?:\.{PATH_KEY}|\[\d+\])*")
SIGNATURE_FORMATS = ("github", "hex", "stripe")
# `/v1/_webhooks/{name}/test` and `/recent-deliveries` are admin routes: a tenant webhook so named is unreachable
RESERVED_NAMES = frozenset({"test", "recent-deliveries"})
_MAPPING_TARGET_RE = re.compile(r"goal|user_id|(?:user_credentials|run_metadata)\.[A-Za-z0-9_-]+")


def _check_auth(value: Any, name: str, strict: bool) -> dict[str, Any]:
    what = f"webhook {name!r}"
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise Refused(f"{what}: auth must be an object")
    d = drop_unknown(name, "webhook auth", value, _AUTH_FIELDS, strict)
    kind = d.get("kind") or "hmac"
    if kind not in ("hmac", "bearer", "none"):
        raise Refused(f"{what}: auth.kind must be hmac, bearer or none (got {kind!r})")
    out: dict[str, Any] = {"kind": kind}
    if kind == "hmac":
        algorithm = d.get("algorithm") or "sha256"
        if algorithm != "sha256":
            raise Refused(f"{what}: auth.algorithm must be sha256 (got {algorithm!r})")
        out["algorithm"] = algorithm
        out["signing_secret_env"] = get_env_name(d, "signing_secret_env", f"{what}: auth (hmac)", required=True)
        put(out, "format", _check_format(d.get("format"), what))
    if kind == "bearer":
        out["bearer_token_env"] = get_env_name(d, "bearer_token_env", f"{what}: auth (bearer)", required=True)
    put(out, "header", get_text(d, "header", f"{what}: auth"))
    put(out, "delivery_id_header", get_text(d, "delivery_id_header", f"{what}: auth"))
    return out


def _check_format(value: Any, what: str) -> str | None:
    """The one signature envelope an hmac webhook accepts (apps.triggers.webhooks.signatures)."""
    if value is None:
        return None
    if value not in SIGNATURE_FORMATS:
        raise Refused(f"{what}: auth.format must be one of {', '.join(SIGNATURE_FORMATS)} (got {value!r})")
    return str(value)


def _check_mapping(value: Any, what: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise Refused(f"{what}: payload_mapping must map a target to a JSON path such as '$.issue.title'")
    for target, path in value.items():
        if not isinstance(target, str) or not _MAPPING_TARGET_RE.fullmatch(target):
            raise Refused(
                f"{what}: payload_mapping target {target!r} must be goal, user_id, "
                "user_credentials.<name> or run_metadata.<name>"
            )
        if not isinstance(path, str) or not _JSON_PATH_RE.fullmatch(path):
            raise Refused(
                f"{what}: payload_mapping.{target}: {path!r} is not a supported path "
                "(only $, .key and [index]; no .., * or filters)"
            )
    return dict(value) or None


def _check_limits(d: dict[str, Any], what: str) -> dict[str, Any]:
    rate = get_object(d, "rate_limit", what) or {}
    unknown = set(rate) - {"requests_per_minute", "burst"}
    if unknown:
        raise Refused(f"{what}: rate_limit takes requests_per_minute and burst (unknown: {', '.join(sorted(unknown))})")
    sync = get_object(d, "sync_response", what)
    out: dict[str, Any] = {
        "rate_limit": {
            "requests_per_minute": get_int(rate, "requests_per_minute", f"{what}: rate_limit", minimum=1) or 60,
            "burst": get_int(rate, "burst", f"{what}: rate_limit", minimum=1) or 10,
        },
        "body_size_limit_bytes": get_int(d, "body_size_limit_bytes", what, minimum=1) or 1024 * 1024,
    }
    if sync is not None:
        if set(sync) - {"enabled", "timeout_ms"}:
            raise Refused(f"{what}: sync_response takes enabled and timeout_ms")
        out["sync_response"] = {
            "enabled": get_flag(sync, "enabled", f"{what}: sync_response", False),
            "timeout_ms": get_int(sync, "timeout_ms", f"{what}: sync_response", minimum=1) or 30_000,
        }
    return out


def normalise_webhook(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    what = f"webhook {name!r}"
    if "/" in name:
        raise Refused(f"{what}: a webhook name is one segment (it is addressed as /v1/_webhooks/[tenant/]name)")
    if name in RESERVED_NAMES:
        raise Refused(
            f"{what}: the names {', '.join(sorted(RESERVED_NAMES))} are reserved (admin routes under /v1/_webhooks)"
        )
    raw = dict(raw)
    raw.pop("name", None)
    d = drop_unknown(name, "webhook", raw, WEBHOOK_FIELDS, strict)
    delivery = d.get("delivery") or "spawn"
    if delivery not in ("spawn", "channel"):
        raise Refused(f"{what}: delivery must be spawn or channel (got {delivery!r})")
    out: dict[str, Any] = {"enabled": get_flag(d, "enabled", what, True), "delivery": delivery}
    if delivery == "spawn":
        out["agent"] = get_text(d, "agent", f"{what} (delivery spawn)", required=True)
    else:
        out["channel"] = check_channel_name(get_text(d, "channel", f"{what} (delivery channel)", required=True), what)
    out["auth"] = _check_auth(d.get("auth"), name, strict)
    out |= _check_limits(d, what)
    put(out, "payload_mapping", _check_mapping(d.get("payload_mapping"), what))
    out |= check_credentials(d, what)
    out |= common_trigger_fields(d, what, strict)
    return out


WEBHOOK = Kind(
    key="webhook",
    tool="WebhookDef",
    model=WebhookDef,
    pointer=WebhookDefActive,
    ops=TRIGGER_OPS,
    normalise=normalise_webhook,
    content_hash=None,
    fork_promotes=True,
    yaml_key="webhooks",
    credential_env_fields=("user_credentials_from_env", "auth.signing_secret_env", "auth.bearer_token_env"),
)
