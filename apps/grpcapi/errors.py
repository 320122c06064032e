"""An ApplicationError as a gRPC status, the way loomcycle's server maps its errors (SPEC 4.9)
and the official client reads them (loomcycle/errors.py): the HTTP status decides the code,
a few machine codes are named by the code or the message the client branches on, and every
refusal carries a `google.rpc.ErrorInfo` whose `reason` is the HTTP body's `code` (the
client's `LoomcycleError.reason`) and whose metadata holds its details (a backpressure's cap,
user, Retry-After). The status travels as `grpc-status-details-bin`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from apps.core.errors import ApplicationError

DOMAIN = "loomcycle"
SC = grpc.StatusCode

_BY_STATUS: dict[int, grpc.StatusCode] = {
    400: SC.INVALID_ARGUMENT,
    401: SC.UNAUTHENTICATED,
    403: SC.PERMISSION_DENIED,
    404: SC.NOT_FOUND,
    409: SC.FAILED_PRECONDITION,
    410: SC.FAILED_PRECONDITION,
    413: SC.RESOURCE_EXHAUSTED,
    415: SC.INVALID_ARGUMENT,
    422: SC.INVALID_ARGUMENT,
    429: SC.RESOURCE_EXHAUSTED,
    501: SC.UNIMPLEMENTED,
    502: SC.UNAVAILABLE,
    503: SC.UNAVAILABLE,
    504: SC.DEADLINE_EXCEEDED,
}

# Codes whose gRPC code or message the official client keys on (errors.py / client.py
# `_raise_typed_from_grpc`): agent_id in use is ALREADY_EXISTS (AgentIDInUseError); the
# message prefixes are the client's discriminators (SessionBusyError, AlreadyPausingError,
# NotPausedError, SnapshotVersionError, SessionNotFoundError, PauseNotConfiguredError).
_BY_CODE: dict[str, tuple[grpc.StatusCode | None, str]] = {
    "agent_id_in_use": (SC.ALREADY_EXISTS, ""),
    "session_busy": (None, "session busy"),
    "already_pausing": (None, "already pausing"),
    "not_paused": (None, "not paused"),
    "snapshot_version_too_new": (SC.FAILED_PRECONDITION, "snapshot section version too new"),
    "snapshot_version_unknown": (SC.FAILED_PRECONDITION, "snapshot section version unknown"),
    "snapshot_too_large": (SC.RESOURCE_EXHAUSTED, "snapshot too large"),
    "session_not_found": (SC.NOT_FOUND, "session not found"),
    "pause_not_configured": (SC.UNAVAILABLE, "pause_not_configured"),
}


@dataclass(frozen=True)
class Refusal:
    code: grpc.StatusCode
    message: str
    reason: str
    metadata: dict[str, str]

    def trailer(self) -> tuple[tuple[str, bytes], ...]:
        """The google.rpc.Status (code, message, ErrorInfo[, RetryInfo]) as the details trailer."""
        info = error_details_pb2.ErrorInfo(reason=self.reason, domain=DOMAIN, metadata=self.metadata)
        details = [_packed(info)]
        retry_after = self.metadata.get("retry_after")
        if retry_after and retry_after.isdigit():
            details.append(
                _packed(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=int(retry_after))))
            )
        status = status_pb2.Status(code=_rpc_code(self.code), message=self.message, details=details)
        return (("grpc-status-details-bin", status.SerializeToString()),)


def _packed(message: Any) -> any_pb2.Any:
    out = any_pb2.Any()
    out.Pack(message)
    return out


def _rpc_code(code: grpc.StatusCode) -> int:
    """grpc.StatusCode's numbers are google.rpc.Code's."""
    number: int = code.value[0]
    return number


def _flat(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)


def refusal(exc: ApplicationError) -> Refusal:
    code = _BY_STATUS.get(exc.status, SC.INTERNAL if exc.status >= 500 else SC.INVALID_ARGUMENT)
    override, prefix = _BY_CODE.get(exc.code, (None, ""))
    message = f"{prefix}: {exc.message}" if prefix and prefix not in exc.message.lower() else exc.message
    metadata = {str(k): _flat(v) for k, v in exc.details.items()}
    retry_after = exc.headers.get("Retry-After")
    if retry_after:
        metadata["retry_after"] = retry_after
    return Refusal(override or code, message, exc.code, metadata)


def invalid(message: str, reason: str = "invalid_request") -> Refusal:
    return Refusal(SC.INVALID_ARGUMENT, message, reason, {})
