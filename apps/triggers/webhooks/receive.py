"""The receiver pipeline of SPEC 9.2, in its order: lookup, bounded body,
verify before parse, delivery id, durable dedupe, mapping, rate limit,
delivery. Blocking (DB, Redis): the async view runs it on a worker thread.

What an unauthenticated caller can make us write is bounded:
- a path naming no definition (or not an identifier at all) is a 404 that
  writes nothing: logged at debug and counted (`unknown_refused`);
- any other refusal is recorded with its verdict, but only within the
  definition's rate limit: a refused delivery takes a token from the same
  bucket as an accepted one, and once the bucket is empty the caller gets
  429 `rate_limited` and no row is written;
- a replay (a delivery id, or signed bytes, already acted on) is answered with the first copy's
  outcome whatever the rate, and recorded only when it gets a token."""

from __future__ import annotations

import hashlib
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from apps.core.errors import ApplicationError
from apps.core.ids import is_ident
from apps.runs.services import run_resolve
from apps.triggers.webhooks.errors import (
    BadBody,
    BadDelivery,
    RateLimited,
    RuntimeUnavailable,
    SyncUnavailable,
    UnknownWebhook,
    WebhookRefused,
)
from apps.triggers.webhooks.mapping import Mapped, map_payload
from apps.triggers.webhooks.models import Verdict
from apps.triggers.webhooks.ratelimit import Limit, take
from apps.triggers.webhooks.selectors import Hook, webhook_resolve
from apps.triggers.webhooks.services import (
    Delivered,
    delivery_publish,
    delivery_record,
    delivery_replay,
    delivery_spawn,
    run_input,
    spawn_refusal,
)
from apps.triggers.webhooks.signatures import resolve_secret, signed_digest, verify

log = logging.getLogger("loomcycle.webhooks")

MAX_DELIVERY_ID = 256
DEFAULT_BODY_LIMIT = 1024 * 1024
_unknown = itertools.count(1)
_unknown_seen = 0


def unknown_refused() -> int:
    """How many deliveries this process refused as unknown (never recorded)."""
    return _unknown_seen


def _refuse_unknown(incoming: Incoming, why: str) -> UnknownWebhook:
    global _unknown_seen
    _unknown_seen = next(_unknown)
    log.debug("webhook delivery refused (%s): tenant %r name %r", why, incoming.tenant[:64], incoming.name[:64])
    return UnknownWebhook("unknown webhook")


@dataclass(frozen=True)
class Incoming:
    """One request as the pipeline sees it: lower-cased headers, and a
    `read(n)` that returns at most n bytes of the body."""

    tenant: str
    name: str
    headers: Mapping[str, str]
    content_length: int | None
    read: Callable[[int], bytes]
    sync: bool = False


@dataclass(frozen=True)
class Accepted:
    hook: Hook
    delivered: Delivered
    sync_timeout_ms: int = 0  # > 0: the caller waits for the run's terminal status


class DisabledWebhook(UnknownWebhook):
    """The same 404 as an unknown webhook to the caller; recorded (rate-limited) as disabled."""

    verdict = Verdict.REJECTED_DISABLED

    def __init__(self, hook: Hook) -> None:
        super().__init__("unknown webhook")
        self.hook = hook


def lookup(tenant: str, name: str) -> Hook:
    """Unknown and disabled are the same 404 to the caller (only disabled is recorded)."""
    hook = webhook_resolve(tenant_id=tenant, name=name)
    if hook is None:
        raise UnknownWebhook("unknown webhook")
    if not hook.enabled:
        raise DisabledWebhook(hook)
    return hook


def _limit(hook: Hook) -> Limit:
    rate = hook.definition.get("rate_limit") or {}
    return Limit(rate.get("requests_per_minute", 60), rate.get("burst", 10))


def read_body(incoming: Incoming, limit: int) -> bytes:
    """At most `limit` bytes: a declared length over it is refused unread, and
    never more than limit + 1 bytes are read of an undeclared one."""
    if incoming.content_length is not None and incoming.content_length > limit:
        raise BadBody(f"body exceeds {limit} bytes")
    body = incoming.read(limit + 1)
    if len(body) > limit:
        raise BadBody(f"body exceeds {limit} bytes")
    return body


def delivery_id_of(hook: Hook, headers: Mapping[str, str], body: bytes) -> str:
    """The configured header's value, else `sha256:<hex of body>`."""
    header = str(hook.definition.get("auth", {}).get("delivery_id_header") or "").lower()
    value = headers.get(header, "").strip() if header else ""
    if not value:
        return "sha256:" + hashlib.sha256(body).hexdigest()
    if len(value) > MAX_DELIVERY_ID or not value.isprintable():
        raise BadDelivery(f"delivery id header must be at most {MAX_DELIVERY_ID} printable characters")
    return value


def _sync_timeout_ms(hook: Hook, sync: bool) -> int:
    if not sync:
        return 0
    sync_response = hook.definition.get("sync_response") or {}
    if hook.definition.get("delivery") != "spawn" or not sync_response.get("enabled"):
        raise SyncUnavailable("this webhook does not answer synchronously (sync_response is not enabled)")
    return int(sync_response.get("timeout_ms") or 30_000)


def _deliver(hook: Hook, incoming: Incoming, body: bytes, delivery_id: str) -> Accepted:
    signed = signed_digest(hook.definition.get("auth") or {}, incoming.headers, body)
    replay = delivery_replay(hook=hook, delivery_id=delivery_id, signed=signed, may_record=partial(_replay_token, hook))
    if replay is not None:
        return Accepted(hook, replay)
    wait_ms = _sync_timeout_ms(hook, incoming.sync)
    d = hook.definition
    spawn = d.get("delivery", "spawn") == "spawn"
    mapped = map_payload(body, d.get("payload_mapping")) if spawn else None
    take(tenant_id=hook.owner, name=hook.name, limit=_limit(hook))
    if mapped is not None:
        delivered = delivery_spawn(hook=hook, delivery_id=delivery_id, mapped=mapped, signed=signed)
        return Accepted(hook, delivered, wait_ms)
    return Accepted(hook, delivery_publish(hook=hook, delivery_id=delivery_id, body=body, signed=signed))


def _replay_token(hook: Hook) -> bool:
    """A replay is answered with its first copy's outcome whatever the rate (a sender's
    retry after a lost answer must not be refused), but recorded only when it gets a
    token: what a replayer, signed or not, can make us write stays bounded by the limit."""
    try:
        take(tenant_id=hook.owner, name=hook.name, limit=_limit(hook))
    except RateLimited:
        return False
    except RuntimeUnavailable as exc:
        log.warning("webhook %s/%s: replay answered but not recorded: %s", hook.owner, hook.name, exc.message)
        return False
    return True


def webhook_receive(incoming: Incoming) -> Accepted:
    """Run the pipeline; a refusal is recorded (see the module docstring), then raised for the view to answer."""
    if not is_ident(incoming.name) or (incoming.tenant and not is_ident(incoming.tenant)):
        raise _refuse_unknown(incoming, "path segment is not an identifier")
    hook: Hook | None = None
    delivery_id = ""
    try:
        hook = lookup(incoming.tenant, incoming.name)
        body = read_body(incoming, int(hook.definition.get("body_size_limit_bytes") or DEFAULT_BODY_LIMIT))
        verify(hook.definition.get("auth") or {}, incoming.headers, body, owner=hook.owner)  # before any parse
        delivery_id = delivery_id_of(hook, incoming.headers, body)
        return _deliver(hook, incoming, body, delivery_id)
    except DisabledWebhook as exc:
        _record(exc.hook, exc, delivery_id, took=False)
        raise
    except UnknownWebhook:
        raise _refuse_unknown(incoming, "no such definition") from None
    except WebhookRefused as exc:
        assert hook is not None  # lookup is the only step before there is a hook, handled above
        _record(hook, exc, delivery_id, took=_took_token(exc))
        raise


def _took_token(exc: WebhookRefused) -> bool:
    """Whether the refused delivery already went through the rate limiter (it refuses after it)."""
    return isinstance(exc, RateLimited) or exc.verdict in _AFTER_TAKE


_AFTER_TAKE = frozenset({Verdict.REJECTED_SPAWN_SETUP, Verdict.REJECTED_CHANNEL, Verdict.TIMEOUT})


def _record(hook: Hook, exc: WebhookRefused, delivery_id: str, *, took: bool) -> None:
    """Record the refusal, taking a token first unless it already took one; over the
    limit the caller gets 429 and nothing is written."""
    if not took:
        try:
            take(tenant_id=hook.owner, name=hook.name, limit=_limit(hook))
        except RateLimited as limited:
            raise limited from exc
        except RuntimeUnavailable as down:
            log.warning("webhook %s/%s: refusal not recorded, rate limiter down: %s", hook.owner, hook.name, down)
            return
    detail = exc.record_detail or exc.message
    delivery_record(owner=hook.owner, name=hook.name, delivery_id=delivery_id, verdict=exc.verdict, detail=detail)


def webhook_dry_run(*, tenant: str, name: str, body: bytes) -> dict[str, Any]:
    """`POST /v1/_webhooks/{name}/test`: what a delivery of `body` would do,
    signature aside (the caller is an authenticated admin); writes nothing."""
    hook = lookup(tenant, name)
    d = hook.definition
    preview: dict[str, Any] = {"agent": d.get("agent", ""), "user_id": "", "goal": "", "credential_keys": []}
    try:
        read_body(
            Incoming(tenant, name, {}, len(body), lambda n: body[:n]),
            int(d.get("body_size_limit_bytes") or DEFAULT_BODY_LIMIT),
        )
        auth = d.get("auth") or {}
        if auth.get("kind") == "none":
            verify(auth, {}, body, owner=hook.owner)  # refused unless unauthenticated mode is on
        for field in ("signing_secret_env", "bearer_token_env"):
            if auth.get(field):
                resolve_secret(str(auth[field]), owner=hook.owner)
        if d.get("delivery", "spawn") == "spawn":
            mapped = map_payload(body, d.get("payload_mapping"))
            preview |= _preview(mapped)
            _resolve_run(hook, mapped)
        else:
            preview["channel"] = d.get("channel", "")
    except WebhookRefused as exc:
        return {
            "would_accept": False,
            "verdict": exc.verdict,
            "code": exc.code,
            "error": exc.message,
            "run_input_preview": preview,
        }
    return {"would_accept": True, "verdict": Verdict.ACCEPTED, "run_input_preview": preview}


def _preview(mapped: Mapped) -> dict[str, Any]:
    return {"user_id": mapped.user_id, "goal": mapped.goal, "credential_keys": sorted(mapped.credentials)}


def _resolve_run(hook: Hook, mapped: Mapped) -> None:
    try:
        run_resolve(tenant_id=hook.run_tenant, data=run_input(hook, mapped))
    except ApplicationError as exc:
        raise spawn_refusal(exc) from exc
