"""Payload mapping (SPEC 9.2 step 6): `{target: path}` with paths of `$`,
`.key` and `[index]` only, evaluated on the parsed JSON body.

A tiny parser rather than a JSONPath library: the subset is three token
kinds, and a library would accept (and need refusing) everything else.
WebhookDef validation (apps.substrate.kinds.webhook) already refuses
any other path, so `parse_path` failing here means a definition written
before that check: a 400 `bad_mapping`, never a 500.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from apps.core.errors import Invalid
from apps.core.http import loads_checked
from apps.core.ids import is_ident
from apps.substrate.kinds.webhook import PATH_KEY
from apps.triggers.webhooks.errors import BadMapping

log = logging.getLogger("loomcycle.webhooks")

_TOKEN_RE = re.compile(rf"\.({PATH_KEY})|\[(\d+)\]")
Step = str | int


def parse_path(path: str) -> list[Step]:
    """`$.a.b[0]` -> ["a", "b", 0]; ValueError for anything outside the subset."""
    if not path.startswith("$"):
        raise ValueError(f"{path!r} does not start with $")
    steps: list[Step] = []
    pos = 1
    while pos < len(path):
        match = _TOKEN_RE.match(path, pos)
        if match is None:
            raise ValueError(f"{path!r}: unsupported syntax at {path[pos : pos + 10]!r} (only $, .key and [index])")
        steps.append(match.group(1) if match.group(1) is not None else int(match.group(2)))
        pos = match.end()
    return steps


_MISSING = object()


def lookup(document: Any, steps: list[Step]) -> Any:
    """The value at `steps`, or _MISSING."""
    for step in steps:
        if isinstance(step, int) and isinstance(document, list) and step < len(document):
            document = document[step]
        elif isinstance(step, str) and isinstance(document, dict) and step in document:
            document = document[step]
        else:
            return _MISSING
    return document


def as_text(value: Any) -> str:
    """A mapped value as text: strings as they are, anything else as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Mapped:
    """What a delivery's body maps to. `credentials` holds values: it is never stored."""

    goal: str
    user_id: str = ""
    run_metadata: dict[str, str] = field(default_factory=dict)
    credentials: dict[str, str] = field(default_factory=dict)


def parse_json(body: bytes) -> Any:
    try:
        return loads_checked(body)
    except Invalid as exc:
        raise BadMapping("payload_mapping needs a JSON body").with_detail(exc.message) from exc


def _resolve(document: Any, mapping: dict[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for target, path in mapping.items():
        try:
            steps = parse_path(path)
        except ValueError as exc:
            raise BadMapping(f"payload_mapping.{target}: unsupported path").with_detail(str(exc)) from exc
        value = lookup(document, steps)
        if value is _MISSING:
            log.info("webhook mapping: %s -> %s is missing in the payload; mapped to an empty string", target, path)
            value = ""
        out[target] = as_text(value)
    return out


def map_payload(body: bytes, mapping: dict[str, str] | None) -> Mapped:
    """Apply `mapping` to the body; without one the whole body is the goal."""
    if not mapping:
        return Mapped(goal=_body_text(body))
    values = _resolve(parse_json(body), mapping)
    user_id = values.get("user_id", "")
    if user_id and not is_ident(user_id):
        raise BadMapping("mapped user_id must match [A-Za-z0-9_-]{1,128}")
    return Mapped(
        goal=values["goal"] if "goal" in values else _body_text(body),
        user_id=user_id,
        run_metadata={k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("run_metadata.")},
        credentials={k.split(".", 1)[1]: v for k, v in values.items() if k.startswith("user_credentials.")},
    )


def _body_text(body: bytes) -> str:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadMapping("the body is not UTF-8 text").with_detail(str(exc)) from exc
    if "\x00" in text:
        raise BadMapping("the body contains NUL characters")
    return text
