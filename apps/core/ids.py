"""Server-minted identifiers in loomcycle's formats (SPEC 2.0)."""

from __future__ import annotations

import re
import secrets
import time

IDENT_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")  # always used with fullmatch


def _hex16() -> str:
    return secrets.token_hex(8)


def new_run_id() -> str:
    return f"r_{_hex16()}"


def new_agent_id() -> str:
    return f"a_{_hex16()}"


def new_session_id() -> str:
    return f"s_{_hex16()}"


def new_def_id() -> str:
    return f"def_{_hex16()}"


def new_mock_tool_id() -> str:
    return f"mock_tu_{_hex16()}"


def new_interrupt_id() -> str:
    """`intr_<16hex ns><8hex>`: time-sortable, as SPEC 2.0 mints them."""
    return f"intr_{time.time_ns():016x}{secrets.token_hex(4)}"


def is_ident(value: str) -> bool:
    return IDENT_RE.fullmatch(value) is not None
