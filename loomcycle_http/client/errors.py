"""Typed errors: every refusal of the API is an `ApiError` carrying its HTTP status and
the body's machine-readable `code`, human `message` and `details`; a runtime that could
not be reached is a `ConnectionFailed`. Both are `LoomcycleError`s."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx


class LoomcycleError(Exception):
    """Base of every error the client raises. `code` is machine-readable."""

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ConnectionFailed(LoomcycleError):
    """The runtime could not be reached, or the connection broke and did not come back in time."""

    code = "connection_failed"


class FollowTimeout(LoomcycleError):
    """A followed run did not end (or, with `until_input`, park) within the follow's `timeout`. The
    run is left as it is: cancel it with `runs.cancel(agent_id)` if it should not go on."""

    code = "follow_timeout"

    def __init__(self, message: str, *, run_id: str, agent_id: str, last_seq: int) -> None:
        super().__init__(message)
        self.run_id, self.agent_id, self.last_seq = run_id, agent_id, last_seq


class ApiError(LoomcycleError):
    """The runtime answered with an error status. `status` is the HTTP status, `code` the body's."""

    def __init__(
        self, status: int, code: str, message: str, details: dict[str, Any], retry_after: float | None
    ) -> None:
        super().__init__(f"HTTP {status} {code}: {message}", code=code)
        self.status = status
        self.message = message
        self.details = details
        self.retry_after = retry_after


class BadRequest(ApiError):
    """400 or 422: the request was malformed or refused as invalid."""


class Unauthorized(ApiError):
    """401: missing, wrong or retired token."""


class Forbidden(ApiError):
    """403: the token lacks the scope, or open mode refused a non-loopback client."""


class NotFound(ApiError):
    """404: no such run, agent, key or channel (another tenant's is a 404 too)."""


class Conflict(ApiError):
    """409: the state forbids the request (agent_id in use, already pausing, ...)."""


class PayloadTooLarge(ApiError):
    """413."""


class RateLimited(ApiError):
    """429: a cap or a full queue; `retry_after` says when to try again (seconds) when the server said."""


class ServerError(ApiError):
    """5xx: the runtime failed, is paused (503 `runtime_paused`) or a backing service is down."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: BadRequest,
    429: RateLimited,
}


def _retry_after(resp: httpx.Response) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP date (RFC 9110 10.2.3); None when absent or unreadable."""
    value = resp.headers.get("retry-after", "").strip()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def error_from_response(resp: httpx.Response) -> ApiError:
    """The typed error of a non-2xx response whose body has been read."""
    code, message = f"http_{resp.status_code}", resp.text[:500] or resp.reason_phrase
    details: dict[str, Any] = {}
    try:
        body = resp.json()
    except ValueError:  # not JSON (a proxy's page): the text is the message
        body = None
    if isinstance(body, dict):
        code = str(body.get("code") or code)
        message = str(body.get("error") or body.get("message") or message)
        found = body.get("details")
        details = found if isinstance(found, dict) else {}
    cls = _BY_STATUS.get(resp.status_code, ServerError if resp.status_code >= 500 else ApiError)
    return cls(resp.status_code, code, message, details, _retry_after(resp))
