"""`loomcycle run`'s cancel of its own run, against a scripted HTTP peer (httpx.MockTransport):
a Ctrl-C while the POST is in flight can reach the runtime before the create commits."""

from __future__ import annotations

import json

import httpx

from loomcycle_http.cli.run import cancel_run
from loomcycle_http.client import Client

HANDLE = "a_00000000000000bb"


def peer(not_yet: int, asked: list[str]) -> httpx.MockTransport:
    """Answers the cancel 404 `not_yet` times (the create not committed), then cancels."""

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content)["reason"])
        if len(asked) <= not_yet:
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no such agent"}})
        return httpx.Response(200, json={"cancelled": True, "agent_id": HANDLE})

    return httpx.MockTransport(answer)


def test_a_cancel_after_the_post_left_asks_again_until_the_run_exists() -> None:
    asked: list[str] = []
    with Client("http://runtime.test", transport=peer(2, asked)) as lc:
        assert cancel_run(lc, HANDLE, "interrupted (Ctrl-C)", posted=True) is True
    assert asked == ["interrupted (Ctrl-C)"] * 3


def test_a_cancel_before_any_post_takes_the_404_at_once() -> None:
    asked: list[str] = []
    with Client("http://runtime.test", transport=peer(99, asked)) as lc:
        assert cancel_run(lc, HANDLE, "interrupted (Ctrl-C)", posted=False) is False
    assert len(asked) == 1
