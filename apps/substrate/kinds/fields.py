"""Field checks shared by the admin-plane kinds: each raises `Refused` with
a message naming the definition and the field."""

from __future__ import annotations

import re
from typing import Any

from apps.core.config import runtime_config
from apps.core.secrets import config_secret_names, name_refusal, referenced_names
from apps.substrate.kinds.base import Refused

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
IDENT_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
CHANNEL_SEGMENT_RE = re.compile(r"[A-Za-z0-9_.-]+")


def get_text(d: dict[str, Any], key: str, what: str, *, required: bool = False) -> str:
    value = d.get(key)
    if value is None or value == "":
        if required:
            raise Refused(f"{what}: missing required field: {key}")
        return ""
    if not isinstance(value, str):
        raise Refused(f"{what}: {key} must be a string")
    return value


def get_int(d: dict[str, Any], key: str, what: str, *, minimum: int) -> int | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        kind = "a non-negative" if minimum == 0 else "a positive"
        raise Refused(f"{what}: {key} must be {kind} integer (got {value!r})")
    return value


def get_flag(d: dict[str, Any], key: str, what: str, default: bool) -> bool:
    value = d.get(key, default)
    if not isinstance(value, bool):
        raise Refused(f"{what}: {key} must be true or false")
    return value


def get_object(d: dict[str, Any], key: str, what: str) -> dict[str, Any] | None:
    value = d.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise Refused(f"{what}: {key} must be an object")
    return value


def get_str_map(d: dict[str, Any], key: str, what: str, *, env_values: bool = False) -> dict[str, str] | None:
    value = get_object(d, key, what)
    if value is None:
        return None
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise Refused(f"{what}: {key} must map strings to strings")
        if env_values and not ENV_NAME_RE.fullmatch(v):
            raise Refused(f"{what}: {key}.{k}: {v!r} is not an environment variable name")
        if env_values:
            check_secret_name(v, f"{what}: {key}.{k}", runtime=False)
    return dict(value)


def get_env_name(d: dict[str, Any], key: str, what: str, *, required: bool) -> str:
    value = get_text(d, key, what, required=required)
    if value and not ENV_NAME_RE.fullmatch(value):
        raise Refused(f"{what}: {key} {value!r} is not an environment variable name")
    if value:
        check_secret_name(value, f"{what}: {key}", runtime=False)
    return value


def check_secret_name(name: str, what: str, *, runtime: bool) -> None:
    """A credential source or `${NAME}` reference may not name one of the
    runtime's own secrets (fixed ones, and the key variables yaml names)."""
    refusal = name_refusal(name, runtime=runtime, denied=config_secret_names(runtime_config()))
    if refusal:
        raise Refused(f"{what}: {refusal}")


def get_secret_map(d: dict[str, Any], key: str, what: str, *, runtime: bool) -> dict[str, str] | None:
    """A string map whose values may hold `${NAME}` references, stored as
    written (resolved only at use, see kinds.mcp.mcp_server_connection)."""
    value = get_str_map(d, key, what)
    for k, v in (value or {}).items():
        for name in referenced_names(v):
            check_secret_name(name, f"{what}: {key}.{k}", runtime=runtime)
    return value


# Channels under this prefix are declared in yaml with `publisher: system`:
# agents never publish to them, and the REST API neither creates them nor
# publishes to them except through POST /v1/_channels/{name}.
SYSTEM_CHANNEL_PREFIX = "_system/"


def is_system_channel(name: str) -> bool:
    return name.startswith(SYSTEM_CHANNEL_PREFIX)


def check_channel_name(name: Any, what: str) -> str:
    """`/`-separated segments of [A-Za-z0-9_.-], no `.`/`..` segments, <= 256 chars."""
    if not isinstance(name, str) or not name:
        raise Refused(f"{what}: channel name must be a non-empty string")
    if len(name) > 256:
        raise Refused(f"{what}: channel name {name[:40]!r}... is longer than 256 characters")
    for segment in name.split("/"):
        if not CHANNEL_SEGMENT_RE.fullmatch(segment) or segment in (".", ".."):
            raise Refused(f"{what}: channel name {name!r}: each '/'-separated segment must match [A-Za-z0-9_.-]+")
    return name


def put(out: dict[str, Any], key: str, value: Any) -> None:
    if value is not None and value != "":
        out[key] = value
