"""Per-run credentials (issue 20): checked at the door (400 invalid_credentials),
sealed on the run row for this run only, opened into the ToolContext by the
engine, inherited by sub-agents, cleared at the end, never in an API answer."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from django.db import transaction

from apps.core.errors import Invalid
from apps.core.tools import SpawnRequest
from apps.gateway.providers import ToolCall
from apps.runs import services, store
from apps.runs.children.spawn import children_insert, spawn_prepare
from apps.runs.credentials import (
    CredentialsUnreadable,
    credentials_check,
    credentials_from_wire,
    seal,
    unseal,
)
from apps.runs.engine import step
from apps.runs.models import Run, RunInput, RunStatus
from apps.runs.prompt import Segment
from tests.conftest import ALICE, wait_for, wait_status

pytestmark = pytest.mark.usefixtures("agents")

CREDS = {"user_bearer": "bearer.Tok-1234567890abcdef", "github": "cred-gh-9f8e7d6c5b4a"}


def _create(agent: str = "echo", credentials: dict[str, str] | None = None, prompt: str = "hi") -> Run:
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], credentials=credentials or CREDS)
    return services.run_create(principal=ALICE, data=data)


@pytest.mark.parametrize(
    ("bearer", "creds", "message"),
    [
        ("short", None, "user_bearer must match"),
        ("has space in it 1234567", None, "user_bearer must match"),
        (None, {"bad name!": "long-enough-value"}, "each name must match"),
        (None, {"x" * 65: "long-enough-value"}, "each name must match"),
        (None, {"user_bearer": "long-enough-value"}, "reserved for the user_bearer field"),
        (None, {"short": "1234567"}, "8..8192 characters"),
        (None, {"big": "x" * 8193}, "8..8192 characters"),
        (None, {"num": 12345678}, "must be a string"),
        (None, {f"k{i}": "long-enough-value" for i in range(33)}, "at most 32 entries"),
        (None, {"nl": "long-enough-value\n"}, "valid HTTP header value"),  # h11 would quote it escaped
        (None, {"cr": "long-enough\r\nX-Evil: value"}, "valid HTTP header value"),
        (None, {"ctl": "long-enough\x00value"}, "valid HTTP header value"),
        (None, {"del": "long-enough-value\x7f"}, "valid HTTP header value"),
        (None, {"lead": " long-enough-value"}, "valid HTTP header value"),
        (None, {"utf": "long-enough-valu\u00e9"}, "valid HTTP header value"),
    ],
)
def test_bad_credentials_are_refused_without_quoting_the_value(
    bearer: str | None, creds: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises(Invalid) as refused:
        credentials_from_wire(user_bearer=bearer, user_credentials=creds)
    assert refused.value.code == "invalid_credentials" and message in refused.value.message
    assert "long-enough-value" not in refused.value.message and "has space" not in refused.value.message


def test_run_create_checks_the_credentials_it_is_given() -> None:
    with pytest.raises(Invalid):
        _create(credentials={"user_bearer": "short"})
    with pytest.raises(Invalid):
        _create(credentials={"k": "long-enough-value\n"})
    assert credentials_check(CREDS) == CREDS
    assert credentials_check({"spaced": "Basic abc def\tghi"}) == {"spaced": "Basic abc def\tghi"}


def test_cancel_and_input_work_when_this_process_cannot_open_the_credentials(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The run is sealed with this deployment's key (a worker opens it and sleeps in
    # its model turn); then this web process's key differs, as when DJANGO_SECRET_KEY
    # is not shared: input and cancel still answer, the runtime redactor standing in.
    data = services.RunCreate(
        agent="scripted", segments=[Segment(text='MOCK_SCRIPT: [{"sleep_ms": 60000}]')], credentials=CREDS
    )
    run = services.run_create(principal=ALICE, data=data)
    settings.SECRET_KEY = "another-process-key-" + "x" * 40
    with pytest.raises(CredentialsUnreadable):
        unseal(run_id=run.id, sealed=Run.objects.get(id=run.id).credentials_sealed)
    with caplog.at_level("WARNING", logger="loomcycle.credentials"):
        services.run_input(principal=ALICE, run_id=run.id, text="carry on please")
        services.run_cancel(principal=ALICE, agent_id=run.agent_id, reason="stop now")
    assert RunInput.objects.get(run_id=run.id).text == "carry on please"
    assert wait_status(run.id, RunStatus.CANCELLED).cancel_reason == "stop now"
    warned = [r.getMessage() for r in caplog.records if r.name == "loomcycle.credentials"]
    assert warned and all(run.id in m for m in warned)
    assert not any(v in m for m in warned for v in CREDS.values())


def test_sealed_credentials_open_only_for_their_run() -> None:
    sealed = seal(run_id="r_1", credentials=CREDS)
    assert CREDS["github"] not in sealed and CREDS["user_bearer"] not in sealed
    assert unseal(run_id="r_1", sealed=sealed) == CREDS
    with pytest.raises(CredentialsUnreadable):
        unseal(run_id="r_2", sealed=sealed)  # moved onto another run
    tampered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(CredentialsUnreadable):
        unseal(run_id="r_1", sealed=tampered)
    assert seal(run_id="r_1", credentials={}) == "" and unseal(run_id="r_1", sealed="") == {}


@pytest.mark.usefixtures("no_workers")
def test_the_engine_opens_the_sealed_credentials_into_the_tool_context() -> None:
    run = _create()
    row = Run.objects.get(id=run.id)
    assert row.credentials_sealed and CREDS["github"] not in row.credentials_sealed
    claimed = store.claim(run_id=run.id, step=0, owner="test", lease_seconds=0)  # lapses at once: cancel finishes it
    assert claimed is not None
    assert step.open_credentials(claimed) is None
    assert claimed.credentials == CREDS
    assert CREDS["github"] not in repr(claimed)
    services.run_cancel(principal=ALICE, agent_id=run.agent_id)


@pytest.mark.usefixtures("no_workers")
def test_sub_agents_inherit_exactly_the_parents_credentials() -> None:
    parent = _create()
    call = ToolCall(id="c1", name="Agent", input={"name": "echo", "prompt": "child"})
    spawn = spawn_prepare(
        tenant_id="",
        user_id="",
        depth=0,
        call=call,
        request=SpawnRequest(agent="echo", prompt="child"),
        parent_id=parent.id,
        credentials=CREDS,
    )
    with transaction.atomic():
        (child_id,) = children_insert(parent_id=parent.id, tenant_id="", user_id="", depth=0, spawns=[spawn])
    child = Run.objects.get(id=child_id)
    assert unseal(run_id=child.id, sealed=child.credentials_sealed) == CREDS
    assert child.credentials_sealed != Run.objects.get(id=parent.id).credentials_sealed  # sealed for the child
    services.run_cancel(principal=ALICE, agent_id=parent.agent_id)  # and the child with it
    # A session worker may hold the child: its cancel then lands at the worker's commit.
    assert wait_status(child_id, RunStatus.CANCELLED).credentials_sealed == ""


@pytest.mark.usefixtures("stack")
def test_parallel_spawn_children_inherit_exactly_the_parents_credentials() -> None:
    kid = {"name": "fan-child", "prompt": 'MOCK_SCRIPT: [{"sleep_ms": 60000}]'}  # live while we look
    fan = {"op": "parallel_spawn", "spawns": [kid, kid]}
    prompt = f"MOCK_SCRIPT: {json.dumps([{'tool': 'Agent', 'input': fan}, {'text': 'done'}])}"
    parent = _create(agent="fanner-wide", prompt=prompt)
    wait_for(lambda: Run.objects.filter(parent_id=parent.id).count() == 2, timeout=30)
    children = list(Run.objects.filter(parent_id=parent.id))
    sealed_parent = Run.objects.get(id=parent.id).credentials_sealed
    for child in children:
        assert unseal(run_id=child.id, sealed=child.credentials_sealed) == CREDS
        assert child.credentials_sealed != sealed_parent  # sealed for the child
    services.run_cancel(principal=ALICE, agent_id=parent.agent_id)  # and the children with it
    for child in children:
        assert wait_status(child.id, RunStatus.CANCELLED).credentials_sealed == ""


def test_a_cancel_clears_the_sealed_credentials_and_steering_text_is_stored_redacted() -> None:
    # A model turn that sleeps a minute: whether a session worker has claimed the run
    # (the cancel lands in its provider call) or none runs (a queued run is cancelled
    # at once), the run is still mid-turn when the input and the cancel arrive.
    data = services.RunCreate(
        agent="scripted", segments=[Segment(text='MOCK_SCRIPT: [{"sleep_ms": 60000}]')], credentials=CREDS
    )
    run = services.run_create(principal=ALICE, data=data)
    services.run_input(principal=ALICE, run_id=run.id, text=f"now use {CREDS['github']}")
    assert RunInput.objects.get(run_id=run.id).text == "now use [redacted:github]"
    services.run_cancel(principal=ALICE, agent_id=run.agent_id, reason=f"stop {CREDS['user_bearer']}")
    row = wait_status(run.id, RunStatus.CANCELLED)
    assert row.credentials_sealed == ""
    assert row.cancel_reason == row.stop_reason == "stop [redacted:user_bearer]"


@pytest.mark.usefixtures("stack")
def test_the_api_refuses_bad_credentials_and_never_answers_with_them(http: httpx.Client) -> None:
    bad = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "user_credentials": {"k": "short"}})
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_credentials"
    body = {
        "agent": "echo",
        "prompt": "hi",
        "background": True,
        "user_bearer": CREDS["user_bearer"],
        "user_credentials": {"github": CREDS["github"]},
    }
    created = http.post("/v1/runs", json=body)
    assert created.status_code == 202, created.text
    ids = created.json()
    run = wait_status(ids["run_id"], RunStatus.COMPLETED)
    assert run.credentials_sealed == ""  # the terminal commit cleared them
    answers = [
        created.text,
        http.get(f"/v1/agents/{ids['agent_id']}").text,
        http.get(f"/v1/runs/{ids['run_id']}").text,
        http.get(f"/v1/runs/{ids['run_id']}/events").text,
        http.get("/v1/users/default/agents", params={"status": "all"}).text,
    ]
    for text in answers:
        assert CREDS["github"] not in text and CREDS["user_bearer"] not in text
        assert "credentials" not in text
