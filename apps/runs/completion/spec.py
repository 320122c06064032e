"""A run's `webhook` as the request (or the agent's default) gives it, checked before any row is
written: an http(s) URL the SSRF guard would let through by name (its address is checked again at
every attempt), events from a closed set, and a signing secret that resolves. Bad input is a 400
`invalid_webhook`; a webhook with no secret to sign with is a 400 `webhook_secret_missing`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from pydantic import BaseModel, Field, ValidationError

from apps.core import egress
from apps.core.errors import Invalid
from apps.core.secrets import credential_env_refusal, key_from_env

END_EVENTS = ("completed", "failed", "cancelled")
PARK_EVENTS = ("awaiting_input", "awaiting_interrupt")
EVENTS = (*END_EVENTS, *PARK_EVENTS)


class WebhookIn(BaseModel):
    """POST /v1/runs `webhook` (and an agent's `webhook` default)."""

    url: str = Field(min_length=1, max_length=2048)
    secret_ref: str | None = Field(default=None, max_length=128, description="env variable holding the secret")
    events: list[str] | None = Field(default=None, description=f"subset of {', '.join(EVENTS)}; default: the end")
    model_config = {"extra": "forbid"}


@dataclass(frozen=True)
class Webhook:
    url: str
    secret_ref: str  # "" = LOOMCYCLE_RUN_WEBHOOK_SECRET
    events: tuple[str, ...]


def policy() -> egress.HostPolicy:
    """Where a webhook may go: the operator's host allowlist when set, else any public host;
    non-public addresses only for LOOMCYCLE_HTTP_PRIVATE_HOST_ALLOWLIST (as tool-use hooks)."""
    return egress.operator_policy(tuple(settings.LOOMCYCLE.http_host_allowlist) or None)


def webhook_of(raw: Any, *, tenant_id: str) -> Webhook | None:
    """The checked webhook of a request's or an agent's `webhook` value (None when absent)."""
    if raw is None:
        return None
    try:
        data = raw if isinstance(raw, WebhookIn) else WebhookIn.model_validate(raw)
    except ValidationError as exc:
        raise Invalid(f"webhook: {exc.errors()[0]['msg']}", code="invalid_webhook") from exc
    events = tuple(dict.fromkeys(data.events)) if data.events is not None else END_EVENTS
    unknown = [e for e in events if e not in EVENTS]
    if unknown or not events:
        raise Invalid(f"webhook.events: each one of {', '.join(EVENTS)}", code="invalid_webhook")
    try:
        egress.check_url(httpx.URL(data.url), policy())
    except (egress.EgressRefused, httpx.InvalidURL) as exc:
        raise Invalid(f"webhook.url refused: {exc}", code="invalid_webhook") from exc
    webhook = Webhook(url=data.url, secret_ref=data.secret_ref or "", events=events)
    signing_secret(webhook, tenant_id=tenant_id)  # a webhook that could never be signed is refused now
    return webhook


def signing_secret(webhook: Webhook, *, tenant_id: str) -> str:
    """The secret a delivery is signed with; Invalid when it is not allowed or not set."""
    if not webhook.secret_ref:
        secret = settings.LOOMCYCLE.run_webhook_secret
        if not secret:
            raise Invalid(
                "webhook has no secret_ref and LOOMCYCLE_RUN_WEBHOOK_SECRET is unset", code="webhook_secret_missing"
            )
        return secret
    refusal = credential_env_refusal(
        webhook.secret_ref, tenant_id=tenant_id, tenant_allowlist=settings.LOOMCYCLE.tenant_credential_env
    )
    if refusal is not None:
        raise Invalid(f"webhook.secret_ref: {refusal}", code="invalid_webhook")
    value = key_from_env(webhook.secret_ref)
    if not value:
        raise Invalid(f"webhook.secret_ref: {webhook.secret_ref} is unset or empty", code="webhook_secret_missing")
    return value
