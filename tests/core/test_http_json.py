"""apps.core.http.loads_checked: every JSON the store or Python cannot take is a 400, never a 500."""

from __future__ import annotations

import pytest

from apps.core.errors import Invalid
from apps.core.http import loads_checked


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b'{"n": ' + b"9" * 5000 + b"}", "invalid_json"),  # past Python's int digit limit: ValueError
        (b"[" * 100_000 + b"]" * 100_000, "invalid_body"),  # RecursionError
        (b'{"a": "\\u0000"}', "invalid_body"),
        (b"\xff", "invalid_json"),
    ],
    ids=["big-int", "deep", "nul", "not-utf8"],
)
def test_unusable_json_is_a_400(raw: bytes, code: str) -> None:
    with pytest.raises(Invalid) as refused:
        loads_checked(raw)
    assert refused.value.code == code and refused.value.status == 400
