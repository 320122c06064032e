"""The console's tenancy probe, generated from apps.console.urls so a new page is covered
without editing this file: acme (alice) owns one of every kind of resource the console
shows, each carrying MARK; a session of another tenant (charlie, beta) asks every console
URL for acme's resource and for one that exists nowhere. The two answers must be alike
(same status), neither may carry MARK or acme's ids, none is a 5xx, and acme's resources are
unchanged afterwards. A route with a path parameter that has no resolver fails the test with
its name: add one to RESOLVERS (and a body to BODIES if a POST needs one to reach its lookup).

Runs against the session's real web process and workers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from django.urls import URLPattern, URLResolver

from apps.channels import access, selectors, verbs
from apps.console import urls as console_urls
from apps.core.types import Principal
from apps.memory import keyops
from apps.runs import services
from apps.runs.models import Interrupt, Run, RunStatus
from apps.runs.prompt import Segment
from apps.substrate import tokens
from apps.substrate.channeldefs import ChannelSpec, channeldef_create
from apps.substrate.kinds import get_kind
from apps.substrate.services import def_dispatch, operator_author
from tests.conftest import wait_for, wait_status
from tests.console.conftest import bearer, csrf_of, http_sign_in

pytestmark = pytest.mark.usefixtures("agents", "stack", "web")

MARK = "acmemark7f3a"
ALICE = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
_PARAM = re.compile(r"<(?:\w+:)?(\w+)>")
_QUERY_PARAM = re.compile(r"\{(\w+)\}")


@dataclass
class Acme:
    run: Run
    asking: Run  # parked on a pending Interruption.ask
    interrupt_id: str
    # console2's resources below this line: acme's agent, webhook and channel share one name
    # (PROBE_NAME), so the one `name` resolver reaches each of them on its own route.
    schedule_id: str = ""
    def_ids: tuple[str, ...] = ()


PROBE_NAME = "probe-target"


Resolver = Callable[[Acme], str]
RESOLVERS: dict[str, Resolver] = {
    "run_id": lambda acme: acme.asking.id,  # a live run: cancel, input and turn-cancel reach their checks
    "session_id": lambda acme: acme.run.session_id,
    "interrupt_id": lambda acme: acme.interrupt_id,
    "user_id": lambda acme: "alice",
    # console2's parameters below this line.
    "kind": lambda acme: "agent",
    "name": lambda acme: PROBE_NAME,
    "def_id": lambda acme: acme.schedule_id,
}
UNKNOWN: dict[str, str] = {
    "run_id": "r_0000000000000000",
    "session_id": "s_0000000000000000",
    "interrupt_id": "intr_00000000000000000000000000",
    "user_id": "nobody",
    # console2's parameters below this line.
    "kind": "agent",
    "name": "no-such-name",
    "def_id": "def_00000000000000000000",
}
# POST bodies that get a probe past form validation to its lookup (url name -> fields).
BODIES: dict[str, dict[str, str]] = {
    "run-fork": {"from_step": "0", "prompt": "MOCK_SCRIPT: []"},
    "chat-input": {"message": "probe"},
    "session-send": {"message": "probe"},
    "inbox-resolve": {"disposition": "answer", "answer": "yes"},
    # console2's bodies below this line.
    "library-def": {"op": "verify", "content_sha256": "sha256:" + "0" * 64},
    "channel": {"payload": '"probe"'},
}
# Query strings that name resources (url name -> template over RESOLVERS' parameters).
QUERIES: dict[str, str] = {
    "runs-compare": "?a={run_id}&b={run_id}",
    "inbox": "?user={user_id}",
    # console2's queries below this line.
}
# Routes the probe cannot exercise, each with why.
UNEXERCISED: dict[str, str] = {
    "signin": "the sign-in form names no resource (tests/console/test_signin.py)",
    "signout": "ends the caller's own session (tests/console/test_signin.py)",
}


def console_routes() -> list[tuple[str, str]]:
    """(url name, route with <params>) of every console route."""
    out = []
    for entry in console_urls.urlpatterns:
        assert isinstance(entry, URLPattern) and not isinstance(entry, URLResolver)
        out.append((str(entry.name), str(entry.pattern)))
    return out


def fill(route: str, values: dict[str, str], query: str = "") -> str:
    return "/ui/" + _PARAM.sub(lambda m: values[m.group(1)], route) + query.format(**values)


@pytest.fixture
def acme(people: dict[str, dict[str, str]]) -> Acme:
    prompt = f"{MARK} MOCK_SCRIPT: " + json.dumps([{"text": f"answer {MARK}"}])
    run = services.run_create(
        principal=ALICE, data=services.RunCreate(agent="scripted", segments=[Segment(text=prompt)])
    )
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    ask = {"op": "ask", "question": f"ship {MARK}?", "options": ["yes", "no"]}
    script = json.dumps([{"tools": [{"tool": "Interruption", "input": ask}]}, {"text": "done"}])
    asking = services.run_create(
        principal=ALICE, data=services.RunCreate(agent="asker", segments=[Segment(text=f"MOCK_SCRIPT: {script}")])
    )
    wait_status(asking.id, RunStatus.AWAITING_INTERRUPT, timeout=30)
    interrupt = wait_for(lambda: Interrupt.objects.filter(run_id=asking.id).first())
    return Acme(run=Run.objects.get(id=run.id), asking=asking, interrupt_id=interrupt.id, **acme_definitions())


def acme_definitions() -> dict[str, Any]:
    """console2's resources of acme, each carrying MARK: an agent, a webhook and a schedule
    definition, a channel with a message, a memory row (the run above is its spend)."""
    author = operator_author(ALICE)

    def create(kind: str, overlay: dict[str, Any], name: str = PROBE_NAME) -> str:
        data = {"op": "create", "name": name, "description": MARK, "overlay": overlay}
        return str(def_dispatch(get_kind(kind), author, data)["def_id"])

    agent = create("agent", {"provider": "mock", "model": "mock-script", "system_prompt": MARK})
    webhook = create("webhook", {"agent": "echo", "auth": {"kind": "none"}})
    schedule = create("schedule", {"agent": "scripted", "schedule": "0 0 1 1 *", "prompt": MARK}, "probe-cron")
    channeldef_create(tenant_id="acme", name=PROBE_NAME, spec=ChannelSpec(description=MARK, scope="tenant"))
    verbs.publish(access.admin_stream(ALICE, PROBE_NAME), value={"m": MARK}, ttl=None, deliver_at=None, by_user="t")
    keyops.key_put(ALICE, "tenant", "", "probe/key", keyops.MemoryPutIn(value=MARK))
    return {"schedule_id": schedule, "def_ids": (agent, webhook, schedule)}


def _answer(client: httpx.Client, method: str, path: str, name: str) -> httpx.Response:
    if method == "GET":
        return client.get(path)
    csrf = csrf_of(client.get("/ui/runs/").text)
    return client.post(path, data={"csrfmiddlewaretoken": csrf, **BODIES.get(name, {})})


def _leaks(acme: Acme, response: httpx.Response, named: str) -> bool:
    """MARK, or an acme id the probe did not name itself (a 404 page repeats the id asked for)."""
    ids = (acme.run.id, acme.asking.id, acme.interrupt_id, acme.run.session_id, *acme.def_ids)
    return MARK in response.text or any(i in response.text and i not in named for i in ids)


def test_a_foreign_tenants_session_sees_nothing_of_acme_on_any_console_page(
    web: str, people: dict[str, dict[str, str]], acme: Acme
) -> None:
    probed = []
    with httpx.Client(base_url=web, timeout=30) as client:
        http_sign_in(client, bearer(people["charlie"]))
        for name, route in console_routes():
            if name in UNEXERCISED:
                continue
            query = QUERIES.get(name, "")
            params = _PARAM.findall(route) + _QUERY_PARAM.findall(query)
            missing = [p for p in params if p not in RESOLVERS]
            assert not missing, f"console route {name} ({route}): add a resolver for {missing}"
            theirs = fill(route, {p: RESOLVERS[p](acme) for p in params}, query)
            nowhere = fill(route, {p: UNKNOWN[p] for p in params}, query)
            for method in ("GET", "POST") if _PARAM.search(route) else ("GET",):
                got, unknown = _answer(client, method, theirs, name), _answer(client, method, nowhere, name)
                assert got.status_code < 500, (name, method, got.status_code)
                assert got.status_code == unknown.status_code, (name, method, got.status_code, unknown.status_code)
                assert not _leaks(acme, got, theirs), (name, method, got.text[:500])
                probed.append((name, method, got.status_code))
    print("probed:", probed)
    assert Run.objects.get(id=acme.run.id).status == RunStatus.COMPLETED
    assert Run.objects.get(id=acme.asking.id).status == RunStatus.AWAITING_INTERRUPT
    assert Interrupt.objects.get(id=acme.interrupt_id).status == "pending"
    assert Run.objects.filter(forked_from_run_id__in=[acme.run.id, acme.asking.id]).count() == 0
    assert Run.objects.filter(session_id=acme.run.session_id).count() == 1
    assert not get_kind("agent").model.objects.filter(name=PROBE_NAME).exclude(tenant_id="acme").exists()
    board = selectors.peek(stream=access.admin_stream(ALICE, PROBE_NAME)[0], from_cursor=None, max_messages=10)
    assert [m["value"] for m in board.messages] == [{"m": MARK}]  # no probe published to acme's channel


def test_an_end_user_token_sees_only_its_own_runs(web: str, people: dict[str, dict[str, str]]) -> None:
    eve = tokens.token_create(name="eve", tenant_id="acme", subject="eve", scopes=["substrate:user"])["token"]
    acting = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant", "runs:act-as-user"}))
    mine = services.run_create(
        principal=acting, data=services.RunCreate(agent="scripted", segments=[Segment(text="hi")], user_id="eve")
    )
    other = services.run_create(
        principal=acting, data=services.RunCreate(agent="scripted", segments=[Segment(text=MARK)], user_id="frank")
    )
    with httpx.Client(base_url=web, timeout=30) as client:
        http_sign_in(client, eve)
        listing = client.get("/ui/runs/").text
        assert mine.id in listing and other.id not in listing
        for name, route in console_routes():
            if name in UNEXERCISED or _PARAM.findall(route) != ["run_id"]:
                continue
            theirs = client.get(fill(route, {"run_id": other.id}))
            nowhere = client.get(fill(route, {"run_id": UNKNOWN["run_id"]}))
            assert theirs.status_code == nowhere.status_code, name
            assert MARK not in theirs.text and "frank" not in theirs.text, name
