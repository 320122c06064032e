"""One attempt of a completion webhook: the JSON body, its Standard Webhooks signature, the POST
through the SSRF guard (apps.core.egress: the URL's host and every address it resolves to are
checked at each attempt, redirects are not followed, no cookies), and the outcome.

Headers (https://www.standardwebhooks.com, the `standardwebhooks` package signs them):
`webhook-id` (the delivery id: the same on every attempt, the receiver's idempotency key),
`webhook-timestamp` (Unix seconds of this attempt), `webhook-signature` (`v1,<base64 HMAC-SHA256
of "<id>.<timestamp>.<body>">`). docs/api.md says how to verify them.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from django.conf import settings
from standardwebhooks import Webhook as Signer

from apps.core import egress
from apps.core.errors import Invalid
from apps.core.timefmt import ts
from apps.runs.completion.spec import Webhook, policy, signing_secret
from apps.runs.models import Run, TranscriptEntry
from apps.runs.store.webhooks import Claimed

log = logging.getLogger("loomcycle.runs.webhooks")

USER_AGENT = "loomcycle-webhook/1"
MAX_OUTPUT_CHARS = 64 * 1024


@dataclass(frozen=True)
class Outcome:
    status: int | None  # the HTTP status, None when nothing answered
    error: str


def body_of(claimed: Claimed) -> dict[str, Any]:
    """What the receiver gets: the event and the run as its row says now (the output is its last
    assistant turn's text)."""
    run = Run.objects.get(id=claimed.run_id)
    return {
        "id": claimed.id,
        "type": f"run.{claimed.event}",
        "event": claimed.event,
        "created_at": ts(datetime.now(UTC)),
        "run": {
            "run_id": run.id,
            "agent_id": run.agent_id,
            "agent": run.agent_name,
            "session_id": run.session_id,
            "tenant_id": run.tenant_id,
            "user_id": run.user_id,
            "status": claimed.event,
            "stop_reason": run.stop_reason,
            "error": run.error,
            "usage": run.usage,
            "metadata": run.metadata,
            "started_at": ts(run.started_at or run.created_at),
            "completed_at": ts(run.completed_at),
            "output": _output(run.id),
        },
    }


def _output(run_id: str) -> str:
    last = TranscriptEntry.objects.filter(run_id=run_id, role="assistant").order_by("-idx").first()
    blocks = last.content if last is not None and isinstance(last.content, list) else []
    text = "".join(str(b.get("text", "")) for b in blocks if isinstance(b, dict) and b.get("type") == "text")
    return text[:MAX_OUTPUT_CHARS]


def signed_headers(*, delivery_id: str, body: str, secret: str) -> dict[str, str]:
    """`secret` is raw text, or `whsec_<base64>` as Standard Webhooks libraries issue them."""
    now = datetime.now(UTC)
    signer = Signer(secret if secret.startswith("whsec_") else secret.encode())
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": delivery_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signer.sign(delivery_id, now, body),
    }


def attempt(claimed: Claimed) -> Outcome:
    """POST the delivery once; never raises for the receiver's or the network's failures."""
    try:
        secret = signing_secret(Webhook(claimed.url, claimed.secret_ref, ()), tenant_id=claimed.tenant_id)
    except Invalid as exc:  # the secret went away since the run was created: retried, it may come back
        return Outcome(None, exc.message)
    body = json.dumps(body_of(claimed), separators=(",", ":"))
    headers = signed_headers(delivery_id=claimed.id, body=body, secret=secret)
    timeout = settings.LOOMCYCLE.run_webhook_timeout_ms / 1000.0
    try:
        with egress.client(policy=policy(), timeout=timeout, max_redirects=0, follow_redirects=False) as client:
            response = client.post(claimed.url, content=body.encode(), headers=headers)
    except egress.EgressRefused as exc:
        return Outcome(None, f"refused by the egress guard: {exc.reason}")
    except httpx.HTTPError as exc:
        return Outcome(None, f"{type(exc).__name__}: {exc}")
    if 200 <= response.status_code < 300:
        return Outcome(response.status_code, "")
    return Outcome(response.status_code, f"receiver answered {response.status_code}")
