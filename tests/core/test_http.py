"""`apps.core.http.parse_body` status mapping and `apps.core.ids` formats."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from django.http import HttpRequest
from django.test import RequestFactory
from pydantic import BaseModel

from apps.core import ids
from apps.core.errors import Invalid, PayloadTooLarge, UnsupportedMediaType
from apps.core.http import parse_body


class Body(BaseModel):
    name: str
    count: int = 1


class AllDefaults(BaseModel):
    name: str = "default"


rf = RequestFactory()


def post(body: bytes | str, content_type: str | None = "application/json", **extra: str) -> HttpRequest:
    raw = body.encode() if isinstance(body, str) else body
    if content_type is None:
        request = rf.generic("POST", "/x", data=raw, content_type="application/json", **extra)
        del request.META["CONTENT_TYPE"]
        return request
    return rf.generic("POST", "/x", data=raw, content_type=content_type, **extra)


# --- content type -----------------------------------------------------------


def test_json_body_is_validated_into_the_schema() -> None:
    parsed = parse_body(post('{"name": "a", "count": 3}'), Body, max_bytes=1024)
    assert parsed == Body(name="a", count=3)


def test_json_with_charset_parameter_is_accepted() -> None:
    parsed = parse_body(post('{"name": "a"}', "application/json; charset=utf-8"), Body, max_bytes=1024)
    assert parsed.name == "a"


def test_form_urlencoded_content_type_is_parsed_as_json() -> None:
    parsed = parse_body(post('{"name": "curl"}', "application/x-www-form-urlencoded"), Body, max_bytes=1024)
    assert parsed.name == "curl"


def test_missing_content_type_is_parsed_as_json() -> None:
    request = post('{"name": "bare"}', content_type=None)
    assert "CONTENT_TYPE" not in request.META
    assert parse_body(request, Body, max_bytes=1024).name == "bare"


@pytest.mark.parametrize("ctype", ["text/plain", "multipart/form-data; boundary=x", "application/xml"])
def test_non_json_content_type_is_415(ctype: str) -> None:
    with pytest.raises(UnsupportedMediaType) as exc:
        parse_body(post('{"name": "a"}', ctype), Body, max_bytes=1024)
    assert exc.value.status == 415
    assert exc.value.code == "unsupported_media_type"


# --- size cap ---------------------------------------------------------------


def test_declared_content_length_over_cap_is_413_before_reading_body() -> None:
    request = post('{"name": "a"}', CONTENT_LENGTH="100000")
    with pytest.raises(PayloadTooLarge) as exc:
        parse_body(request, Body, max_bytes=1000)
    assert exc.value.status == 413
    assert exc.value.code == "payload_too_large"
    assert "1000" in exc.value.message


def test_actual_body_over_cap_is_413_when_content_length_is_absent() -> None:
    body = json.dumps({"name": "x" * 200})
    request = post(body)
    # A client that sends no usable Content-Length (e.g. chunked): the stream
    # still carries the whole body.
    request.META["CONTENT_LENGTH"] = ""
    with pytest.raises(PayloadTooLarge) as exc:
        parse_body(request, Body, max_bytes=50)
    assert exc.value.status == 413


def test_body_exactly_at_cap_is_accepted() -> None:
    body = '{"name": "abc"}'
    assert parse_body(post(body), Body, max_bytes=len(body)).name == "abc"


# --- empty bodies -----------------------------------------------------------


@pytest.mark.parametrize("body", ["", "   \n\t "])
def test_empty_body_is_invalid_when_required(body: str) -> None:
    with pytest.raises(Invalid) as exc:
        parse_body(post(body), Body, max_bytes=1024)
    assert exc.value.status == 400
    assert exc.value.code == "invalid_body"


@pytest.mark.parametrize("body", ["", "  \n"])
def test_empty_body_validates_as_empty_object_when_not_required(body: str) -> None:
    assert parse_body(post(body), AllDefaults, max_bytes=1024, required=False) == AllDefaults()


def test_empty_optional_body_still_fails_schema_with_required_fields() -> None:
    with pytest.raises(Invalid) as exc:
        parse_body(post(""), Body, max_bytes=1024, required=False)
    assert exc.value.code == "invalid_body"


# --- malformed / wrong-shaped JSON -------------------------------------------


@pytest.mark.parametrize("body", [b'{"name": ', b"{name: 1}", b'{"name": "\xff"}'])
def test_malformed_json_is_invalid_json(body: bytes) -> None:
    with pytest.raises(Invalid) as exc:
        parse_body(post(body), Body, max_bytes=1024)
    assert exc.value.status == 400
    assert exc.value.code == "invalid_json"
    assert exc.value.message.startswith("bad json:")


@pytest.mark.parametrize("body", ["[]", '[{"name": "a"}]', '"a"', "42", "null", "true"])
def test_non_object_json_is_invalid_body(body: str) -> None:
    with pytest.raises(Invalid) as exc:
        parse_body(post(body), Body, max_bytes=1024)
    assert exc.value.code == "invalid_body"
    assert exc.value.message == "request body must be a JSON object"


def test_schema_violation_is_invalid_body_with_field_errors() -> None:
    with pytest.raises(Invalid) as exc:
        parse_body(post('{"count": "many"}'), Body, max_bytes=1024)
    err = exc.value
    assert err.status == 400
    assert err.code == "invalid_body"
    errors = err.details["errors"]
    assert {tuple(e["loc"]) for e in errors} == {("name",), ("count",)}
    assert all(set(e) == {"loc", "msg"} and isinstance(e["msg"], str) and e["msg"] for e in errors)
    first = errors[0]
    assert err.message == f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
    assert err.body() == {"code": "invalid_body", "error": err.message, "details": {"errors": errors}}


# --- ids ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mint", "prefix"),
    [
        (ids.new_run_id, "r_"),
        (ids.new_agent_id, "a_"),
        (ids.new_session_id, "s_"),
        (ids.new_def_id, "def_"),
        (ids.new_mock_tool_id, "mock_tu_"),
    ],
)
def test_minted_ids_are_prefix_plus_16_lowercase_hex_and_unique(mint: Callable[[], str], prefix: str) -> None:
    minted = [mint() for _ in range(50)]
    pattern = re.compile(re.escape(prefix) + r"[0-9a-f]{16}")
    assert all(pattern.fullmatch(v) for v in minted), minted
    assert len(set(minted)) == len(minted)
    assert all(ids.is_ident(v) for v in minted)


@pytest.mark.parametrize("value", ["a", "A-z_0-9", "x" * 128, "r_0123456789abcdef", "---", "_"])
def test_is_ident_accepts_letters_digits_dash_underscore_up_to_128(value: str) -> None:
    assert ids.is_ident(value)


@pytest.mark.parametrize("value", ["", "x" * 129, "a b", "a.b", "a/b", "ümlaut", "a\nb", "\na", "name:1", "${X}"])
def test_is_ident_rejects_empty_overlong_and_other_characters(value: str) -> None:
    assert not ids.is_ident(value)


@pytest.mark.parametrize("value", ["a\n", "x" * 128 + "\n"])
def test_is_ident_rejects_trailing_newline(value: str) -> None:
    assert not ids.is_ident(value)
