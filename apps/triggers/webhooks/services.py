"""Webhook delivery writes. Invariants:
- a delivery that is acted on inserts its `first` WebhookDelivery row in the
  SAME transaction as the run it creates (or the channel message it
  publishes): the partial unique index on (tenant, webhook, delivery id) is
  the cluster-wide dedupe, durable across restarts and web processes. A copy
  that loses the race blocks on the index until the winner commits, then
  answers as a replay with the winner's run id;
- the same holds for the digest of what the signature signed (`signed_sha256`,
  a second partial unique index): the delivery-id header is unsigned, so a
  captured delivery re-sent under a fresh id is a replay of the first copy,
  for as long as the first copy's record is kept;
- every delivery, accepted or not, leaves a record row with its verdict;
  records older than LOOMCYCLE_WEBHOOKS_DELIVERY_RETENTION_HOURS are pruned
  on insert, at most once a minute cluster-wide (a Redis SET NX guards it);
- mapped credentials (`user_credentials.<name>`) are passed to the run as its
  per-run credentials (apps.runs.credentials: sealed on the run, 400
  `invalid_run` when one is malformed) and never written in clear: the run's
  redactor masks their values as `[redacted:NAME]` in everything it stores,
  including a goal that is the raw body because `goal` is not mapped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from redis import RedisError

from apps.channels.access import admin_stream
from apps.channels.errors import ChannelValueTooLarge
from apps.channels.services import publish
from apps.core.errors import ApplicationError, QuotaExhausted, RuntimePaused
from apps.core.http import loads_checked
from apps.core.identity import ACT_AS_USER_SCOPE
from apps.core.metrics import count_on_commit
from apps.core.redis import sync_client
from apps.core.scopes import ADMIN
from apps.core.spend import TokenLimitExceeded
from apps.core.types import Principal
from apps.runs.prompt import Segment
from apps.runs.services import RunCreate, run_create
from apps.triggers.metrics import WEBHOOK_DELIVERIES
from apps.triggers.oncomplete import oncomplete_record
from apps.triggers.webhooks.errors import (
    BadBody,
    BudgetExhausted,
    ChannelUnavailable,
    InvalidRun,
    RuntimeUnavailable,
    WebhookRefused,
)
from apps.triggers.webhooks.mapping import Mapped
from apps.triggers.webhooks.models import Verdict, WebhookDelivery
from apps.triggers.webhooks.selectors import Hook, first_delivery

log = logging.getLogger("loomcycle.webhooks")

PUBLISHER = "_system"
PRUNE_GUARD_KEY = "lc:webhooks:prune"
PRUNE_EVERY_S = 60


@dataclass(frozen=True)
class Delivered:
    """What a delivery did (or, `deduped`, what its first copy did)."""

    delivery_id: str
    run_id: str = ""
    agent_id: str = ""
    channel: str = ""
    deduped: bool = False


def delivery_record(
    *, owner: str, name: str, delivery_id: str, verdict: str, detail: str = "", run_id: str = "", channel: str = ""
) -> None:
    """One record row (never a `first` row: those are written with their run)."""
    WebhookDelivery.objects.create(
        tenant_id=owner,
        webhook_name=name[:200],
        delivery_id=delivery_id[:300],
        verdict=verdict,
        detail=detail[:500],
        run_id=run_id,
        channel=channel,
    )
    count_on_commit(WEBHOOK_DELIVERIES, (str(verdict),))
    deliveries_prune_maybe()


def deliveries_prune_maybe() -> int:
    """Delete records past retention, at most once a minute across the cluster."""
    try:
        if not sync_client().set(PRUNE_GUARD_KEY, "1", nx=True, ex=PRUNE_EVERY_S):
            return 0
    except RedisError as exc:  # pruning is housekeeping: the next insert tries again
        log.warning("webhook delivery pruning skipped: %s", exc)
        return 0
    return deliveries_prune()


def deliveries_prune() -> int:
    cutoff = timezone.now() - timedelta(hours=settings.LOOMCYCLE.webhooks_delivery_retention_hours)
    deleted, _ = WebhookDelivery.objects.filter(received_at__lt=cutoff).delete()
    return deleted


def delivery_replay(
    *, hook: Hook, delivery_id: str, signed: str = "", may_record: Callable[[], bool] = lambda: True
) -> Delivered | None:
    """The first copy's outcome (found by delivery id or by signed digest), recorded as
    a replay when `may_record()` says so (the receiver asks the rate limiter); None
    when both are new."""
    first = first_delivery(owner=hook.owner, name=hook.name, delivery_id=delivery_id, signed=signed)
    if first is None:
        return None
    if may_record():
        delivery_record(
            owner=hook.owner,
            name=hook.name,
            delivery_id=delivery_id,
            verdict=Verdict.ACCEPTED_REPLAY,
            detail="" if first.delivery_id == delivery_id else f"same signed bytes as delivery {first.delivery_id}",
            run_id=first.run_id,
            channel=first.channel,
        )
    return Delivered(delivery_id=delivery_id, run_id=first.run_id, channel=first.channel, deduped=True)


def run_input(hook: Hook, mapped: Mapped) -> RunCreate:
    """The payload enters as an untrusted block; payload metadata as a second
    untrusted block; only the definition's own `metadata` is trusted."""
    d = hook.definition
    segments = [Segment(role="user", type="untrusted-block", kind="webhook_payload", text=mapped.goal)]
    if mapped.run_metadata:
        meta = json.dumps(mapped.run_metadata, sort_keys=True, ensure_ascii=False)
        segments.append(Segment(role="user", type="untrusted-block", kind="run_metadata", text=meta))
    return RunCreate(
        agent=str(d["agent"]),
        segments=segments,
        user_id=mapped.user_id,
        metadata=dict(d.get("metadata") or {}),
        user_tier=d.get("user_tier") or None,
        tenant_id=hook.run_tenant,
        credentials=dict(mapped.credentials),
        notify_finished=bool(d.get("on_complete")),  # its end runs the hooks (apps.triggers.oncomplete)
    )


def webhook_principal(hook: Hook) -> Principal:
    """Who a webhook's run is created as: its run tenant, naming the mapped user."""
    return Principal(tenant_id=hook.run_tenant, subject=f"webhook:{hook.name}", scopes=frozenset({ACT_AS_USER_SCOPE}))


def spawn_refusal(exc: ApplicationError) -> WebhookRefused:
    """A run-setup error as the receiver's answer (SPEC 9.2 step 8); a spent budget answers as
    POST /v1/runs does, 429 `token_limit_exceeded` (the sender retries after the window resets)."""
    if isinstance(exc, TokenLimitExceeded):
        return BudgetExhausted(exc.message, headers=exc.headers).with_detail(f"{exc.code}: {exc.message}")
    if isinstance(exc, RuntimePaused | QuotaExhausted):
        return RuntimeUnavailable("runtime unavailable; retry later", headers=exc.headers).with_detail(exc.message)
    code = "unknown_user_tier" if exc.code == "unknown_user_tier" else "invalid_run"
    return InvalidRun(exc.message, code=code).with_detail(f"{exc.code}: {exc.message}")


def delivery_spawn(*, hook: Hook, delivery_id: str, mapped: Mapped, signed: str = "") -> Delivered:
    """Create the run and its `first` row in one transaction (see the module docstring)."""
    data = run_input(hook, mapped)
    try:
        with transaction.atomic():
            row = WebhookDelivery.objects.create(
                tenant_id=hook.owner,
                webhook_name=hook.name,
                delivery_id=delivery_id,
                verdict=Verdict.ACCEPTED,
                first=True,
                signed_sha256=signed,
            )  # a concurrent copy of this delivery blocks here until we commit, then fails on the index
            run = run_create(principal=webhook_principal(hook), data=data)
            WebhookDelivery.objects.filter(pk=row.pk).update(run_id=run.id)
            oncomplete_record(  # in the run's transaction: the hooks exist iff the run does
                run_id=run.id,
                tenant_id=run.tenant_id,
                user_id=run.user_id,
                agent_id=run.agent_id,
                agent_name=run.agent_name,
                hooks=list(hook.definition.get("on_complete") or []),
                origin={"webhook_name": hook.name},
                agent_scope_id=hook.name,
            )
    except IntegrityError:
        replay = delivery_replay(hook=hook, delivery_id=delivery_id, signed=signed)
        if replay is None:  # the winner rolled back after we collided: not a replay, let the sender retry
            raise RuntimeUnavailable("a concurrent copy of this delivery failed; retry") from None
        return replay
    except ApplicationError as exc:
        raise spawn_refusal(exc) from exc
    count_on_commit(WEBHOOK_DELIVERIES, (Verdict.ACCEPTED.value,))
    deliveries_prune_maybe()
    return Delivered(delivery_id=delivery_id, run_id=run.id, agent_id=run.agent_id)


def channel_value(body: bytes) -> Any:
    """The raw body as the message: its JSON value, or its text when it is not JSON."""
    try:
        return loads_checked(body)
    except ApplicationError:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadBody("a channel delivery's body must be JSON or UTF-8 text") from exc
        if "\x00" in text:
            raise BadBody("the body contains NUL characters") from None
        return text


def delivery_publish(*, hook: Hook, delivery_id: str, body: bytes, signed: str = "") -> Delivered:
    """Publish the body to the definition's channel (global scope, publisher
    `_system`) with its `first` row in one transaction."""
    channel = str(hook.definition["channel"])
    value = channel_value(body)
    principal = Principal(tenant_id=hook.run_tenant, subject=PUBLISHER, scopes=frozenset({ADMIN}))
    try:
        stream, declared = admin_stream(principal, channel)
        with transaction.atomic():
            WebhookDelivery.objects.create(
                tenant_id=hook.owner,
                webhook_name=hook.name,
                delivery_id=delivery_id,
                verdict=Verdict.ACCEPTED,
                first=True,
                channel=channel,
                signed_sha256=signed,
            )
            publish(stream=stream, declared=declared, value=value, published_by=PUBLISHER)
    except IntegrityError:
        replay = delivery_replay(hook=hook, delivery_id=delivery_id, signed=signed)
        if replay is None:
            raise RuntimeUnavailable("a concurrent copy of this delivery failed; retry") from None
        return replay
    except ChannelValueTooLarge as exc:
        raise BadBody(exc.message) from exc
    except ApplicationError as exc:
        raise ChannelUnavailable(f'channel "{channel}" is unavailable').with_detail(exc.message) from exc
    count_on_commit(WEBHOOK_DELIVERIES, (Verdict.ACCEPTED.value,))
    deliveries_prune_maybe()
    return Delivered(delivery_id=delivery_id, channel=channel)
