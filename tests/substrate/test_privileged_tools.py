"""Who may use Bash and the operator's host tools (apps.core.privileged): agents of the
operator's yaml, and tenants LOOMCYCLE_BASH_TENANTS lists. A tenant's definition naming one is
refused when written (REST, 422); a row written before the rule (or before its tenant was
unlisted) gets no such tool at run creation, and a run created meanwhile loses it at its next
tool batch (the engine, run in this process as tests/extend/test_hosttools.py does)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from django.test import Client

from apps.core.types import Principal
from apps.runs import services
from apps.runs.models import Run, RunEvent
from apps.runs.prompt import Segment
from apps.substrate.kinds import get_kind
from apps.substrate.models import AgentDef
from apps.substrate.services import Author, def_create
from tests.factories.extend import drive

ACME = Principal(tenant_id="acme", subject="alice", scopes=frozenset({"substrate:tenant"}))
SHELL = {"provider": "mock", "model": "mock-script", "tools": ["Bash", "Read"]}


def listing(settings: Any, *tenants: str) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, bash_tenants=tenants)


def post(client: Client, headers: dict[str, str], body: dict[str, Any]) -> Any:
    return client.post("/v1/_agentdef", data=body, content_type="application/json", headers=headers)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("agents")
def test_a_tenant_may_define_a_bash_agent_only_when_listed(
    settings: Any, client: Client, people: dict[str, dict[str, str]]
) -> None:
    listing(settings)
    body = {"op": "create", "name": "shell", "overlay": SHELL}
    refused = post(client, people["alice"], body)
    assert refused.status_code == 422, refused.content
    message = refused.json()["error"]
    assert refused.json()["code"] == "tool_refused"
    assert "'Bash'" in message and "LOOMCYCLE_BASH_TENANTS" in message and "'acme'" in message
    assert not AgentDef.objects.filter(tenant_id="acme", name="shell").exists()
    fork = post(client, people["alice"], {"op": "fork", "name": "files-rw"})  # the yaml agent with Bash
    assert fork.status_code == 422 and "LOOMCYCLE_BASH_TENANTS" in fork.json()["error"]
    listing(settings, "acme")
    assert post(client, people["alice"], body).status_code == 200
    assert post(client, people["charlie"], body).status_code == 422  # beta is not listed
    listing(settings, "*")
    assert post(client, people["charlie"], body).status_code == 200


def scripted(agent: str) -> Run:
    script = [{"tool": "Bash", "input": {"command": "echo ran"}}, {"text": "done"}]
    data = services.RunCreate(agent=agent, segments=[Segment(text=f"MOCK_SCRIPT: {json.dumps(script)}")])
    return services.run_create(principal=ACME, data=data)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("agents", "no_workers")
def test_a_row_or_run_from_before_the_rule_gets_no_bash(settings: Any) -> None:
    listing(settings, "acme")
    def_create(get_kind("agent"), Author(tenant_id="acme", subject="alice"), {"name": "shell", "overlay": SHELL})
    before = scripted("shell")  # created while acme was listed
    assert "Bash" in before.tools
    listing(settings)  # the operator unlists acme
    assert "Bash" not in scripted("shell").tools and "Read" in scripted("shell").tools
    assert drive(before).status == "completed"
    (result,) = RunEvent.objects.filter(run_id=before.id, type="tool_result")
    assert result.payload["is_error"] and result.payload["text"] == "tool 'Bash' is not allowed for this run"
    assert "Bash" in scripted("files-rw").tools  # the operator's yaml agent keeps it, whoever runs it
