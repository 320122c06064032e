"""The ApplicationError tree. Services raise these; one handler in
`loomcycle_project/api.py` turns each into its HTTP status with the body
`{"code": "...", "error": "<message>", "details": {...}}` (loomcycle's
`{"code","error"}` shape, plus `details`)."""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    status: int = 400
    code: str = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details or {}
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "error": self.message, "details": self.details}


class Invalid(ApplicationError):
    status, code = 400, "invalid_request"


class Unauthorized(ApplicationError):
    status, code = 401, "unauthorized"


class Forbidden(ApplicationError):
    status, code = 403, "forbidden"


class NotFound(ApplicationError):
    status, code = 404, "not_found"


class Conflict(ApplicationError):
    status, code = 409, "conflict"


class PayloadTooLarge(ApplicationError):
    status, code = 413, "payload_too_large"


class UnsupportedMediaType(ApplicationError):
    status, code = 415, "unsupported_media_type"


class Unprocessable(ApplicationError):
    status, code = 422, "unprocessable"


class QuotaExhausted(ApplicationError):
    status, code = 429, "backpressure"


class RuntimePaused(ApplicationError):
    status, code = 503, "runtime_paused"


class Gone(ApplicationError):
    status, code = 410, "gone"
