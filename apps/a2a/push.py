"""Push notifications of A2A tasks, on the SDK's pieces: `RunsPushConfigStore` is the SDK's
`PushNotificationConfigStore` over A2APushConfig rows, and delivery is the SDK's
`BasePushNotificationSender` (its body, the task as a StreamResponse, and its headers,
`X-A2A-Notification-Token` and `Authorization`) over an httpx client of the SSRF guard.

Invariants:
- A config is accepted only for a task the caller sees whose server card says
  `capabilities.push_notifications` (else PushNotificationNotSupportedError), and only for a
  URL that passes the registration gate of peers and MCP servers (http/https, the host
  allowlist, no private IP literal); every delivery dials through apps.core.egress.
- The task is pushed once, when its run ends (apps.runs.lifecycle, then a Celery task on the
  maintenance queue): no worker or request waits on the receiver. Delivery is best effort, as
  the SDK's sender is: a receiver that fails is logged, not retried.
- The config's credentials are sealed to the run (apps.runs.credentials) and never read back
  to a caller: `get`/`list` answer the scheme only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from a2a.server.context import ServerCallContext
from a2a.server.tasks import BasePushNotificationSender
from a2a.server.tasks.push_notification_config_store import (
    PushNotificationConfigStore,
    normalize_push_notification_config,
)
from a2a.types import AuthenticationInfo, TaskPushNotificationConfig
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from apps.a2a import presenters
from apps.a2a.cards import exposed_for
from apps.a2a.models import A2APushConfig
from apps.a2a.runs import closing, run_view_unscoped, visible
from apps.core import egress
from apps.core.errors import Invalid
from apps.core.types import Principal
from apps.runs import credentials as run_credentials
from apps.runs.lifecycle import Ended
from apps.runs.models import TERMINAL
from apps.substrate.kinds import Refused
from apps.substrate.kinds.mcp import check_peer_url

log = logging.getLogger("loomcycle.a2a")

DELIVERY_TIMEOUT_S = 10.0


class PushNotAllowed(Exception):
    """The task's card does not offer push notifications."""


@closing
def push_check(principal: Principal, run_id: str, url: str) -> bool:
    """Whether the caller may register `url` for the task; True when the run has already ended
    (deliver now). Raises PushNotAllowed, NotFound (another tenant's run), Invalid (the URL)."""
    run = visible(principal, run_id)
    card = ((run.metadata or {}).get("a2a") or {}).get("card")
    offered = [e for e in exposed_for(principal.tenant_id).values() if e.card_name == card and e.push_notifications]
    if not offered:
        raise PushNotAllowed(f"task {run.id}'s server card does not offer push notifications")
    try:
        check_peer_url(url, "push notification url", True)
    except Refused as exc:
        raise Invalid(exc.message, code="invalid_push_url") from exc
    return run.status in TERMINAL


def _out(row: A2APushConfig, *, with_credentials: bool = False) -> TaskPushNotificationConfig:
    out = TaskPushNotificationConfig(id=row.config_id, task_id=row.run_id, url=row.url, token=row.token)
    if row.auth_scheme:
        secret = ""
        if with_credentials:
            secret = run_credentials.unseal(run_id=row.run_id, sealed=row.auth_sealed).get("credentials", "")
        out.authentication.CopyFrom(AuthenticationInfo(scheme=row.auth_scheme, credentials=secret))
    return out


@closing
def _set(task_id: str, config: TaskPushNotificationConfig, tenant_id: str) -> TaskPushNotificationConfig:
    normalised = normalize_push_notification_config(task_id, config)
    secret = normalised.authentication.credentials
    sealed = run_credentials.seal(run_id=task_id, credentials={"credentials": secret} if secret else {})
    row, _ = A2APushConfig.objects.update_or_create(
        run_id=task_id,
        config_id=normalised.id,
        defaults={
            "tenant_id": tenant_id,
            "url": normalised.url,
            "token": normalised.token,
            "auth_scheme": normalised.authentication.scheme,
            "auth_sealed": sealed,
        },
    )
    return _out(row)


@closing
def _rows(task_id: str, *, with_credentials: bool) -> list[TaskPushNotificationConfig]:
    rows = A2APushConfig.objects.filter(run_id=task_id).order_by("created_at", "id")
    return [_out(row, with_credentials=with_credentials) for row in rows]


@closing
def _delete(task_id: str, config_id: str | None) -> None:
    rows = A2APushConfig.objects.filter(run_id=task_id)
    (rows.filter(config_id=config_id) if config_id else rows).delete()


class RunsPushConfigStore(PushNotificationConfigStore):
    """The SDK's store over A2APushConfig rows. The handler has checked that the caller sees
    the task (a run of its tenant) before any call here, so a task's configs are its owner's."""

    async def set_info(
        self, task_id: str, notification_config: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        principal: Principal = context.state["loomcycle.principal"]
        return await sync_to_async(_set, thread_sensitive=False)(task_id, notification_config, principal.tenant_id)

    async def get_info(self, task_id: str, context: ServerCallContext) -> list[TaskPushNotificationConfig]:
        return await sync_to_async(_rows, thread_sensitive=False)(task_id, with_credentials=False)

    async def get_info_for_dispatch(self, task_id: str) -> list[TaskPushNotificationConfig]:
        return await sync_to_async(_rows, thread_sensitive=False)(task_id, with_credentials=True)

    async def delete_info(self, task_id: str, context: ServerCallContext, config_id: str | None = None) -> None:
        await sync_to_async(_delete, thread_sensitive=False)(task_id, config_id)


# --- delivery -------------------------------------------------------------------


def on_run_ended(ended: Ended) -> None:
    """apps.runs.lifecycle subscriber (top-level runs): push the task to its configs, off this thread."""
    if A2APushConfig.objects.filter(run_id=ended.run_id, delivered_at__isnull=True).exists():
        deliver_on_commit(ended.run_id)


def deliver_on_commit(run_id: str) -> None:
    from apps.a2a.tasks import a2a_push_deliver_task

    transaction.on_commit(lambda: a2a_push_deliver_task.delay(run_id=run_id))


def deliver(run_id: str) -> int:
    """POST the ended task to each config not yet delivered (the SDK's sender); how many were due."""
    due = A2APushConfig.objects.filter(run_id=run_id, delivered_at__isnull=True)
    count = due.update(delivered_at=timezone.now())  # claimed: a redelivered task pushes nothing twice
    if not count:
        return 0
    task = presenters.task(run_view_unscoped(run_id))
    connection.close()
    allowlist = tuple(settings.LOOMCYCLE.http_host_allowlist) or None
    asyncio.run(_send(run_id, task, egress.operator_policy(allowlist)))
    return count


async def _send(run_id: str, task: Any, policy: egress.HostPolicy) -> None:
    async with egress.async_client(policy=policy, timeout=DELIVERY_TIMEOUT_S) as http:
        await BasePushNotificationSender(http, RunsPushConfigStore()).send_notification(run_id, task)
