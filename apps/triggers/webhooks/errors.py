"""The receiver's refusals (SPEC 2.10): each carries the verdict its delivery
is recorded with. Callers outside the operator see only `code` and `error`."""

from __future__ import annotations

from typing import Self

from apps.core.errors import ApplicationError
from apps.triggers.webhooks.models import Verdict


class WebhookRefused(ApplicationError):
    """`record_detail` goes to the delivery record only (the operator's
    triage), never to the unauthenticated caller."""

    verdict: str = Verdict.REJECTED_BODY
    record_detail: str = ""

    def with_detail(self, detail: str) -> Self:
        self.record_detail = detail
        return self


class UnknownWebhook(WebhookRefused):
    status, code, verdict = 404, "unknown_webhook", Verdict.REJECTED_UNKNOWN


class BadBody(WebhookRefused):
    status, code, verdict = 400, "bad_body", Verdict.REJECTED_BODY


class BadDelivery(WebhookRefused):
    status, code, verdict = 400, "bad_delivery", Verdict.REJECTED_DELIVERY


class BadMapping(WebhookRefused):
    status, code, verdict = 400, "bad_mapping", Verdict.REJECTED_MAPPING


class SignatureRefused(WebhookRefused):
    status, code, verdict = 401, "unauthorized", Verdict.REJECTED_SIG


class SecretUnresolvable(WebhookRefused):
    status, code, verdict = 503, "secret_unresolvable", Verdict.UNRESOLVABLE_SECRET


class UnauthenticatedModeDisabled(WebhookRefused):
    status, code, verdict = 503, "unauthenticated_mode_disabled", Verdict.REJECTED_UNAUTHENTICATED


class RateLimited(WebhookRefused):
    status, code, verdict = 429, "rate_limited", Verdict.REJECTED_RATE


class InvalidRun(WebhookRefused):
    status, code, verdict = 400, "invalid_run", Verdict.REJECTED_SPAWN_SETUP


class BudgetExhausted(WebhookRefused):
    """A hard budget refused the run (SPEC 2.6's `token_limit_exceeded`), with the window's Retry-After."""

    status, code, verdict = 429, "token_limit_exceeded", Verdict.REJECTED_SPAWN_SETUP


class RuntimeUnavailable(WebhookRefused):
    status, code, verdict = 503, "runtime_unavailable", Verdict.REJECTED_SPAWN_SETUP


class ChannelUnavailable(WebhookRefused):
    status, code, verdict = 503, "channel_unavailable", Verdict.REJECTED_CHANNEL


class SyncUnavailable(WebhookRefused):
    status, code, verdict = 503, "sync_unavailable", Verdict.REJECTED_SYNC


class SyncTimeout(WebhookRefused):
    status, code, verdict = 504, "sync_timeout", Verdict.TIMEOUT
