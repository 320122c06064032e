"""loomcycle's three-agent circuit end to end (SPEC 7.5), driven like its
circuit-stress harness: per circuit, declare its two channels over REST, post
the researcher, editor and evaluator runs at once (one user per 10 circuits),
wait for all, then check every output through the REST planes: three memory
keys per circuit, and one evaluation of each editor's run with the score the
evaluator derived from it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from apps.evaluations.models import Evaluation
from apps.gateway.providers.mock import derive_score
from apps.runs.models import Run, RunStatus
from tests.conftest import wait_for

pytestmark = pytest.mark.usefixtures("agents")

CIRCUITS = 20
ROLES = ("researcher", "editor", "evaluator")


def _user(n: int) -> str:
    return f"user-{(n - 1) // 10 + 1:03d}"


def _circuit(web: str, n: int) -> dict[str, str]:
    with httpx.Client(base_url=web, timeout=30) as client:
        for name in (f"research-done/c{n}", f"editing-done/c{n}"):
            resp = client.post("/v1/_channels", json={"name": name, "default_ttl": 600, "max_messages": 1000})
            assert resp.status_code == 201, resp.text
        runs = {}
        for role in ROLES:
            body = {
                "agent": role,
                "prompt": f"Your circuit_id is c{n}. Question: what is new in release {n}?",
                "user_id": _user(n),
                "agent_id": f"{role}-c{n}",
                "background": True,
            }
            resp = client.post("/v1/runs", json=body)
            assert resp.status_code == 202, resp.text
            runs[role] = resp.json()["run_id"]
        return runs


def _memory(http: httpx.Client, user: str, key: str) -> Any:
    resp = http.get(f"/v1/_memory/scopes/user/{user}/keys/{key}")
    assert resp.status_code == 200, (key, resp.text)
    return resp.json()["entry"]["value"]


def test_twenty_concurrent_circuits_complete_with_every_output(http: httpx.Client, web: str, stack: Any) -> None:
    numbers = range(1, CIRCUITS + 1)
    with ThreadPoolExecutor(max_workers=CIRCUITS) as pool:
        circuits = dict(zip(numbers, pool.map(lambda n: _circuit(web, n), numbers), strict=True))
    ids = [run_id for runs in circuits.values() for run_id in runs.values()]
    wait_for(lambda: Run.objects.filter(id__in=ids, status=RunStatus.COMPLETED).count() == len(ids), timeout=120)
    assert Run.objects.filter(id__in=ids).exclude(status=RunStatus.COMPLETED).count() == 0

    for n, runs in circuits.items():
        user = _user(n)
        assert _memory(http, user, f"c{n}-research") == {"text": f"Mock research for c{n}: a brief factual answer."}
        assert _memory(http, user, f"c{n}-research-edited") == {"text": f"Mock edit c{n}: tightened."}
        score = derive_score(runs["editor"] + f"c{n}")
        assert _memory(http, user, f"c{n}-research-scored") == {"rationale": "ok", "score": score}
        (evaluation,) = Evaluation.objects.filter(run_id=runs["editor"])
        assert evaluation.score == score and evaluation.rationale == "ok"
        assert evaluation.emitter_role == "unrelated" and evaluation.evaluator_run_id == runs["evaluator"]
        agent = http.get(f"/v1/agents/editor-c{n}").json()
        assert agent["status"] == "completed", agent
