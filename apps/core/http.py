"""Request-body parsing with loomcycle's status codes (SPEC 2.0): 415 for a
non-JSON content type, 413 over the size cap, 400 for bad JSON or a body that
does not validate (with the field errors in `details`).

Two things valid JSON may carry that the store cannot take are refused here
with 400 `invalid_body` too: a NUL character (`\u0000`) or a lone UTF-16
surrogate (`\ud800`) in any string or key (Postgres `text` and `jsonb` reject
them), and nesting deeper than MAX_JSON_DEPTH (recursive code downstream:
hashing, redaction, jsonb)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection
from django.http import HttpRequest
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from apps.core.errors import Invalid, PayloadTooLarge, UnsupportedMediaType
from apps.core.numbers import parse_count
from apps.core.types import Principal

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")
# curl -d sends application/x-www-form-urlencoded; the body is still parsed as
# JSON (docs/compat.md). Anything else that is not JSON is a 415.
_JSON_TYPES = frozenset({"application/json", "application/x-www-form-urlencoded"})
MAX_JSON_DEPTH = 64


def parse_body(request: HttpRequest, schema: type[M], *, max_bytes: int, required: bool = True) -> M:
    ctype = request.content_type or ""
    if request.META.get("CONTENT_TYPE") and ctype not in _JSON_TYPES:
        raise UnsupportedMediaType("Content-Type must be application/json", code="unsupported_media_type")
    length = parse_count(request.META.get("CONTENT_LENGTH"), max_digits=18)
    if length is not None and length > max_bytes:
        raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes", code="payload_too_large")
    raw = request.body
    if len(raw) > max_bytes:
        raise PayloadTooLarge(f"request body exceeds {max_bytes} bytes", code="payload_too_large")
    if not raw.strip():
        if required:
            raise Invalid("request body is required", code="invalid_body")
        raw = b"{}"
    return validated_body(schema, loads_checked(raw))


def validated_body(schema: type[M], data: Any) -> M:
    """A decoded JSON body (loads_checked's, or one another transport built and passed
    through check_storable, gRPC's) through its route's schema: 400 `invalid_body` naming the
    first wrong field."""
    if not isinstance(data, dict):
        raise Invalid("request body must be a JSON object", code="invalid_body")
    try:
        return schema.model_validate(data)
    except PydanticValidationError as exc:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"]} for e in exc.errors()]
        first = errors[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise Invalid(f"{where}: {first['msg']}", code="invalid_body", details={"errors": errors}) from exc


def loads_checked(raw: bytes | str) -> Any:
    """json.loads, refusing what the store cannot keep (see the module docstring)."""
    try:
        data = json.loads(raw)
    except RecursionError as exc:
        raise Invalid(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", code="invalid_body") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, and an integer past Python's 4300-digit limit
        raise Invalid(f"bad json: {exc}", code="invalid_json") from exc
    check_storable(data)
    return data


def check_storable(data: Any) -> None:
    """Walk `data` without recursion: no NUL in a string or key, depth at most MAX_JSON_DEPTH."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            _check_string(value)
            continue
        if not isinstance(value, dict | list):
            continue
        if depth > MAX_JSON_DEPTH:
            raise Invalid(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", code="invalid_body")
        items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        stack.extend((item, depth + 1) for item in items)


def _check_string(value: str) -> None:
    if "\x00" in value:
        raise Invalid("NUL characters (\\u0000) are not allowed in strings", code="invalid_body")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone UTF-16 surrogate ("\\ud800"): valid JSON, not storable text
        raise Invalid(
            "strings must be valid Unicode (no lone \\ud800-\\udfff surrogates)", code="invalid_body"
        ) from exc


def storable_text(value: str) -> str:
    """`value` made storable without losing its length in characters: NUL
    becomes U+FFFD and a lone surrogate its `\\udXXX` escape (the fast path
    returns `value` itself)."""
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def storable(data: Any) -> Any:
    """A copy of JSON-shaped `data` with every string (and key) made storable by `storable_text`."""
    if isinstance(data, str):
        return storable_text(data)
    if isinstance(data, dict):
        return {storable_text(k) if isinstance(k, str) else k: storable(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [storable(v) for v in data]
    return data


def openapi_body(schema: type[BaseModel], *, enums: dict[str, Sequence[str]] | None = None) -> dict[str, object]:
    """The request body of a route that parses it itself. Nested models are
    referenced under components/schemas; their definitions ride along in `$defs`,
    which loomcycle_project.openapi moves there (the one NinjaAPI's schema).
    `enums` documents the values a service accepts for a plain `str` field
    (an `op`): the description only, the service's own check stays the rule."""
    json_schema = schema.model_json_schema(ref_template="#/components/schemas/{model}")
    for field, values in (enums or {}).items():
        json_schema["properties"][field]["enum"] = list(values)
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": json_schema}}}}


def request_principal(request: HttpRequest) -> Principal:
    """The principal the bearer auth put on the request (every /v1 route has one)."""
    principal: Principal = request.auth  # type: ignore[attr-defined]
    return principal


def db_call(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """For async views: run a blocking body on a worker thread and hand its DB
    connection back to the pool when it ends."""

    def body(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close()

    return sync_to_async(body, thread_sensitive=False)
