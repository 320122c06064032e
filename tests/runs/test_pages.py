"""GET /v1/runs with a cursor and filters (no 1,000 cap), GET /v1/runs/{id}/children and
GET /v1/sessions (issue 38): keyset pages that neither skip nor repeat, filters that narrow,
another tenant's rows absent, bad input a 400 with a code."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Run
from apps.runs.prompt import Segment

pytestmark = pytest.mark.usefixtures("agents", "stack")


def _start(tenant: str, user: str = "u1", prompt: str = "hi", **kw: Any) -> str:
    who = Principal(tenant_id=tenant, subject=user, scopes=frozenset({"substrate:tenant"}))
    text = prompt + "\nMOCK_SCRIPT: " + json.dumps([{"text": "ok"}])
    data = services.RunCreate(agent="scripted", segments=[Segment(text=text)], user_id=user, **kw)
    return services.run_create(principal=who, data=data).id


def _pages(http: httpx.Client, path: str, headers: dict[str, str], key: str, **params: Any) -> list[list[str]]:
    pages, cursor = [], ""
    while True:
        resp = http.get(path, params={**params, "cursor": cursor}, headers=headers)
        assert resp.status_code == 200, resp.text
        body = resp.json()
        pages.append([row["run_id" if key != "sessions" else "session_id"] for row in body[key]])
        cursor = body["next_cursor"]
        if not cursor:
            return pages


def test_runs_page_through_every_run_newest_first_without_repeats(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    ids = [_start("acme") for _ in range(7)]
    _start("beta")
    pages = _pages(http, "/v1/runs", people["alice"], "runs", status="all", limit=3)
    assert [len(p) for p in pages] == [3, 3, 1]
    assert [i for p in pages for i in p] == ids[::-1]


def test_runs_filters_narrow_by_metadata_user_and_time(http: httpx.Client, people: dict[str, dict[str, str]]) -> None:
    a = _start("acme", user="ann", metadata={"order": "42", "shop": "x"})
    b = _start("acme", user="ben", metadata={"order": "43"})
    mid = Run.objects.get(id=b).created_at.isoformat()

    def listed(**params: str) -> list[str]:
        resp = http.get("/v1/runs", params={"status": "all", **params}, headers=people["alice"])
        assert resp.status_code == 200, resp.text
        return [r["run_id"] for r in resp.json()["runs"]]

    assert listed(metadata=json.dumps({"order": "42"})) == [a]
    assert listed(user_id="ben") == [b]
    assert listed(created_before=mid) == [a]
    assert listed(created_after=Run.objects.get(id=a).created_at.isoformat()) == [b]
    assert listed(metadata=json.dumps({"order": "42"}), user_id="ben") == []


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"metadata": "[1]"}, "invalid_filter"),
        ({"metadata": "{nope"}, "invalid_filter"),
        ({"created_after": "yesterday"}, "invalid_time"),
        ({"created_after": "2026-01-01T00:00:00"}, "invalid_time"),
        ({"limit": "0"}, "invalid_limit"),
        ({"cursor": "!!"}, "invalid_cursor"),
        ({"user_id": "no spaces"}, "invalid_request"),
    ],
)
def test_bad_list_input_is_a_400_with_a_code(
    http: httpx.Client, people: dict[str, dict[str, str]], params: dict[str, str], code: str
) -> None:
    for path in ("/v1/runs", "/v1/sessions"):
        if path == "/v1/sessions" and "created_after" in params:
            params = {"active_after": params["created_after"]}
        resp = http.get(path, params=params, headers=people["alice"])
        assert (resp.status_code, resp.json()["code"]) == (400, code), (path, resp.text)


def test_children_are_listed_for_their_parent_only_in_its_tenant(
    http: httpx.Client, people: dict[str, dict[str, str]]
) -> None:
    parent, kids = _start("acme"), [_start("acme") for _ in range(3)]
    Run.objects.filter(id__in=kids).update(parent_id=parent, depth=1)  # as Agent spawns record them
    pages = _pages(http, f"/v1/runs/{parent}/children", people["alice"], "agents", limit=2)
    assert [i for p in pages for i in p] == kids[::-1]
    resp = http.get(f"/v1/runs/{parent}/children", headers=people["charlie"])
    missing = http.get("/v1/runs/r_0000000000000000/children", headers=people["charlie"])
    assert (
        (resp.status_code, resp.json()["code"]) == (missing.status_code, missing.json()["code"]) == (404, "not_found")
    )


def test_sessions_list_a_users_conversations_latest_activity_first(
    http: httpx.Client, people: dict[str, dict[str, str]], no_workers: None
) -> None:
    # No worker runs them: a run's update is activity, and one that ran `first` after `second` was
    # created would make `first`'s conversation the latest.
    first = _start("acme", user="ann", prompt="plan the trip to Lisbon")
    second = _start("acme", user="ann", prompt="other", metadata={"title": "Taxes 2026", "topic": "tax"})
    _start("acme", user="ben")
    _start("beta", user="ann")
    s1, s2 = (Run.objects.get(id=i).session_id for i in (first, second))
    resp = http.get("/v1/sessions", params={"user_id": "ann"}, headers=people["alice"])
    assert resp.status_code == 200, resp.text
    rows = resp.json()["sessions"]
    assert [r["session_id"] for r in rows] == [s2, s1]
    assert rows[0]["title"] == "Taxes 2026"
    assert rows[1]["title"].startswith("plan the trip to Lisbon")
    assert rows[1]["run_count"] == 1 and rows[1]["agent"] == "scripted" and rows[1]["last_run_id"] == first
    assert _pages(http, "/v1/sessions", people["alice"], "sessions", user_id="ann", limit=1) == [[s2], [s1]]
    by_meta = http.get("/v1/sessions", params={"metadata": json.dumps({"topic": "tax"})}, headers=people["alice"])
    assert [r["session_id"] for r in by_meta.json()["sessions"]] == [s2]
    other = http.get("/v1/sessions", params={"user_id": "ann"}, headers=people["charlie"])
    assert s1 not in json.dumps(other.json()) and s2 not in json.dumps(other.json())
