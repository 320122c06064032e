"""Query-string values the list routes share: an RFC 3339 time and a JSON object (a metadata
filter). Bad input is a 400 with a machine code, never a 500."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from apps.core.errors import Invalid

MAX_OBJECT_CHARS = 4096


def query_time(raw: str, what: str) -> datetime | None:
    """None for "", else an aware datetime; Invalid `invalid_time` for a naive or unparsable one."""
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00").replace(" ", "+"))  # `+` arrives as a space
    except ValueError as exc:
        raise Invalid(f"{what} must be an RFC 3339 time", code="invalid_time") from exc
    if value.tzinfo is None:
        raise Invalid(f"{what} must carry a UTC offset (Z or +hh:mm)", code="invalid_time")
    return value


def query_object(raw: str, what: str) -> dict[str, Any]:
    """{} for "", else the JSON object `raw` holds; Invalid `invalid_filter` for anything else."""
    if not raw:
        return {}
    if len(raw) > MAX_OBJECT_CHARS:
        raise Invalid(f"{what} is longer than {MAX_OBJECT_CHARS} characters", code="invalid_filter")
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise Invalid(f'{what} must be a JSON object, e.g. {{"order": "42"}}', code="invalid_filter") from exc
    if not isinstance(value, dict):
        raise Invalid(f'{what} must be a JSON object, e.g. {{"order": "42"}}', code="invalid_filter")
    return value
