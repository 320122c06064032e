"""`ack` never moves a stream's committed cursor backwards (issue 16, item 13):
an older cursor, `cur_0` included, is 409 `channel_cursor_regression`, as in
loomcycle; before anything is committed, acking `cur_0` is a no-op."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.usefixtures("agents")

BOARD = "chanapi/board"  # yaml, scope global


def test_ack_of_cur_0_after_a_commit_is_a_cursor_regression(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    alice = people["alice"]

    def ack(cursor: str) -> httpx.Response:
        return http.post(f"/v1/_channels/{BOARD}/ack", headers=alice, json={"cursor": cursor})

    assert ack("cur_0").json() == {"ok": True}  # nothing committed yet: nothing to regress from
    published = http.post(f"/v1/_channels/{BOARD}/publish", headers=alice, json={"payload": {"n": 1}})
    assert published.status_code == 200, published.text
    read = http.post(f"/v1/_channels/{BOARD}/subscribe", headers=alice, json={}).json()
    assert [m["value"] for m in read["messages"]] == [{"n": 1}] and read["next_cursor"]

    for older in ("cur_0", ""):
        resp = ack(older)
        assert resp.status_code == 409 and resp.json()["code"] == "channel_cursor_regression", (older, resp.text)
    assert ack(read["next_cursor"]).json() == {"ok": True}  # the committed cursor itself is fine
    replay = http.post(f"/v1/_channels/{BOARD}/subscribe", headers=alice, json={}).json()
    assert replay["messages"] == []  # the committed cursor did not move back
