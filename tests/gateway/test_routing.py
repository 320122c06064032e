"""Model routing and provider fallback (SPEC 7.3, 7.4), end to end through
real workers; the resolver's precedence rules against a yaml of its own."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from apps.core.errors import ApplicationError
from apps.gateway.models import UsageEntry
from apps.gateway.providers.base import ProviderError
from apps.gateway.resolver import Candidate, Policy, resolve, resolve_route
from apps.runs.engine.model import _fallback_target, strip_reasoning
from apps.runs.engine.model import call_model as _call_model
from apps.runs.engine.write import Next, StepWrite
from apps.runs.models import RunEvent, RunStatus
from apps.runs.store import ClaimedRun, Switched
from tests.conftest import wait_status
from tests.factories.runs import event_types, start
from tests.procs import WorkerPool

ALWAYS_429 = Candidate("mock", "mock-generic?rate_429=1&latency_ms=0&jitter_ms=0")
STEADY = Candidate("mock-stable", "mock-generic")


def payloads(run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.payload for e in RunEvent.objects.filter(run_id=run_id, type=kind).order_by("seq")]


# --- end to end ---------------------------------------------------------------


@pytest.mark.usefixtures("agents")
def test_a_run_falls_back_to_the_next_candidate_after_retries_on_429(stack: WorkerPool) -> None:
    run = start("tiered")
    assert (run.provider, run.model) == (ALWAYS_429.provider, ALWAYS_429.model)
    assert [c["provider"] for c in run.routing["candidates"]] == ["mock", "mock-stable"]
    done = wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert (done.provider, done.model, done.candidate_idx, done.fallbacks) == ("mock-stable", "mock-generic", 1, 1)
    types = event_types(run.id)
    assert types == ["user_input", "started", "retry", "retry", "retry", "provider_fallback", "text", "usage", "done"]
    (fallback,) = payloads(run.id, "provider_fallback")
    assert fallback["fallback"] == {
        "failed_provider": "mock",
        "failed_model": ALWAYS_429.model,
        "new_provider": "mock-stable",
        "new_model": "mock-generic",
        "attempt": 1,
        "user_tier": "default",
        "reason": "rate_limited",
        "cause_error": fallback["fallback"]["cause_error"],
    }
    assert fallback["fallback"]["cause_error"].startswith("mock 429: rate_limited")
    assert [r["retry"]["reason"] for r in payloads(run.id, "retry")] == ["retry-after header"] * 3
    usage = payloads(run.id, "usage")[0]["usage"]
    assert usage["provider"] == "mock-stable"
    (entry,) = UsageEntry.objects.filter(run_id=run.id)  # the ledger: one row per successful provider call
    assert (entry.source, entry.provider, entry.model, entry.step) == ("run", "mock-stable", "mock-generic", 0)
    assert (entry.input_tokens, entry.output_tokens) == (usage["input_tokens"], usage["output_tokens"])
    assert entry.cost_usd == 0 and entry.user_id == run.user_id


@pytest.mark.usefixtures("agents")
def test_with_fallback_off_the_run_fails_with_an_error_frame(stack: WorkerPool, http: httpx.Client) -> None:
    with http.stream("POST", "/v1/runs", json={"agent": "tiered", "prompt": "hi", "user_tier": "nofallback"}) as r:
        assert r.status_code == 200
        frames = [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:")]
    assert frames[-1]["type"] == "error"
    assert frames[-1]["error"].startswith("mock 429: rate_limited")
    assert "provider_fallback" not in [f.get("type") for f in frames]
    run_id = next(f["run_id"] for f in frames if "run_id" in f)
    failed = wait_status(run_id, RunStatus.FAILED)
    assert failed.provider == "mock" and failed.fallbacks == 0
    assert event_types(run_id) == ["user_input", "started", "retry", "error"]  # nofallback: retry_attempts 1


@pytest.mark.usefixtures("agents")
def test_no_same_provider_retries_means_an_immediate_switch(stack: WorkerPool) -> None:
    run = start("tiered", user_tier="noretry")
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert event_types(run.id)[:3] == ["user_input", "started", "provider_fallback"]


@pytest.mark.usefixtures("agents")
def test_the_agents_providers_narrow_the_tier(stack: WorkerPool) -> None:
    run = start("tiered-pinned-order")
    assert run.provider == "mock-stable" and len(run.routing["candidates"]) == 1
    wait_status(run.id, RunStatus.COMPLETED)


@pytest.mark.usefixtures("agents")
def test_routing_errors_are_refused_before_any_row(http: httpx.Client) -> None:
    r = http.post("/v1/runs", json={"agent": "echo", "prompt": "hi", "user_tier": "gold", "background": True})
    assert r.status_code == 400 and r.json()["code"] == "unknown_user_tier"
    assert "default" in r.json()["error"] and "nofallback" in r.json()["error"]
    r = http.post("/v1/runs", json={"agent": "tiered-unusable", "prompt": "hi", "background": True})
    assert r.status_code == 503 and r.json()["code"] == "tier_unavailable"
    assert "not-configured/big" in r.json()["error"]


# --- the resolver -------------------------------------------------------------


@pytest.fixture
def config(tmp_path: Path, settings: Any) -> Any:
    def use(text: str) -> None:
        path = tmp_path / "routing.yaml"
        path.write_text(text)
        settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, config_files=(str(path),))

    return use


def test_aliases_provider_slash_model_and_defaults(config: Any) -> None:
    config(
        "defaults: {provider: mock, model: mock-generic}\n"
        "models:\n  fast: {provider: mock-stable, model: quick}\n"
        "tiers:\n  low: [fast, mock/other]\n"
    )
    assert resolve(model="fast") == [Candidate("mock-stable", "quick")]
    assert resolve(model="mock/some-model") == [Candidate("mock", "some-model")]
    assert resolve(provider="mock", model="x") == [Candidate("mock", "x")]
    assert resolve() == [Candidate("mock", "mock-generic")]
    assert resolve(tier="low") == [Candidate("mock-stable", "quick"), Candidate("mock", "other")]
    assert resolve_route(tier="low").user_tier == "default"


def test_candidate_sources_and_provider_order(config: Any) -> None:
    config(
        "provider_priority: [mock-stable, mock]\n"
        "tiers:\n  middle: [mock/a, mock-stable/b]\n"
        "user_tiers:\n"
        "  default: {}\n"
        "  pro: {tiers: {middle: [mock/pro]}, provider_priority: [mock]}\n"
    )
    # library priority reorders the library candidates
    assert resolve(tier="middle") == [Candidate("mock-stable", "b"), Candidate("mock", "a")]
    # the user tier's candidates win over the library's
    assert resolve(tier="middle", user_tier="pro") == [Candidate("mock", "pro")]
    # the agent's models win over both; agent providers ∩ user-tier priority
    agent = {"tier": "middle", "models": {"middle": [{"provider": "mock", "model": "own"}]}, "providers": ["mock"]}
    assert resolve(agent=agent, user_tier="pro") == [Candidate("mock", "own")]
    with pytest.raises(ApplicationError) as exc:
        resolve(agent={**agent, "providers": ["mock-stable"]}, user_tier="pro")
    assert (exc.value.status, exc.value.code) == (403, "tier_agent_not_available")


def test_policy_comes_from_the_user_tier(config: Any) -> None:
    config("user_tiers:\n  default: {retry_attempts: 9, max_fallback_attempts: 1, fallback_on_error: false}\n")
    policy = resolve_route(provider="mock", model="m").policy
    assert (policy.retry_attempts, policy.max_fallback_attempts, policy.fallback_on_error) == (5, 1, False)
    with pytest.raises(ApplicationError) as exc:
        resolve(provider="mock", model="m", user_tier="nope")
    assert exc.value.code == "unknown_user_tier"


def test_unknown_inputs_are_400(config: Any) -> None:
    config("models:\n  a: {provider: mock, model: m}\n")
    for kwargs, code in [
        ({"tier": "ultra"}, "bad_request"),
        ({"provider": "nope", "model": "m"}, "unknown_provider"),
        ({}, "bad_request"),
    ]:
        with pytest.raises(ApplicationError) as exc:
            resolve(**kwargs)
        assert (exc.value.status, exc.value.code) == (400, code)


def test_strip_reasoning_drops_thinking_blocks_only() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                {"type": "text", "text": "a"},
            ],
        },
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
    ]
    assert strip_reasoning(messages) == [
        {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
    ]
    plain = messages[:1]
    assert strip_reasoning(plain) is plain


def claimed(**over: Any) -> ClaimedRun:
    """A ClaimedRun as the claim returns it, for the pure fallback decisions."""
    names = [f.name for f in dataclasses.fields(ClaimedRun)]
    base: dict[str, Any] = dict.fromkeys(names, "")
    base.update(
        parent_id=None,
        step=0,
        attempts=1,
        lease_token=1,
        cancel_requested=False,
        system=[],
        max_tokens=1,
        interactive=False,
        max_iterations=16,
        tools=[],
        usage={},
        last_seq=0,
        transcript_len=1,
        pending_inputs=0,
        depth=0,
        routing={},
        candidate_idx=0,
        fallbacks=0,
        first_claim=False,
        runtime_state="running",
        transcript=[],
        provider="mock",
        model="m",
    )
    base.update(over)
    return ClaimedRun(**base)


@pytest.mark.parametrize(
    ("step", "pin", "fallbacks", "status", "expected", "suppressed"),
    [
        (0, False, 0, 429, 1, False),  # a retryable failure moves on
        (3, False, 0, 503, 1, False),
        (0, False, 0, 400, None, False),  # a permanent one fails the run
        (0, False, 3, 429, None, True),  # max_fallback_attempts (3) reached
        (3, True, 0, 429, None, True),  # pin after a successful turn
        (0, True, 0, 429, 1, False),  # ... but not before one
    ],
)
def test_fallback_decisions(
    settings: Any,
    step: int,
    pin: bool,
    fallbacks: int,
    status: int,
    expected: int | None,
    suppressed: bool,
) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, fallback_pin_after_success=pin)
    write = StepWrite(status="running", next=Next.REQUEUE)
    exc = ProviderError("mock", status, "x")
    assert _fallback_target(claimed(step=step), exc, 0, 2, fallbacks, Policy(), write) == expected
    assert [e["type"] for e in write.events] == (["fallback_suppressed"] if suppressed else [])
    assert _fallback_target(claimed(), exc, 1, 2, 0, Policy(), write) is None  # no candidate left
    assert _fallback_target(claimed(), exc, 0, 2, 0, Policy(fallback_on_error=False), write) is None


def test_a_candidate_not_configured_on_this_worker_falls_back_at_once() -> None:
    run = claimed(
        tools=[],
        routing={
            "candidates": [{"provider": "gone", "model": "m"}, {"provider": "mock-stable", "model": "mock-generic"}],
            "policy": Policy().as_dict(),
        },
        provider="gone",
        model="m",
    )
    write = StepWrite(status="running", next=Next.REQUEUE)
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    text, calls, done = _call_model(run, messages, threading.Event(), write)
    assert (text, calls, done.usage.provider) == ("ok", [], "mock-stable")
    assert [e["type"] for e in write.events] == ["provider_fallback"]  # no same-provider retries for it
    assert "not configured on this worker" in write.events[0]["fallback"]["cause_error"]
    assert write.switched == Switched("mock-stable", "mock-generic", 1, 1)


def test_an_agents_retry_attempts_wins_over_its_user_tiers(config: Any) -> None:
    config("user_tiers:\n  default: {retry_attempts: 3}\n")
    pinned = {"provider": "mock", "model": "mock-generic"}
    assert resolve_route(agent=pinned).policy.retry_attempts == 3
    assert resolve_route(agent={**pinned, "retry_attempts": 0}).policy.retry_attempts == 0  # 0: no retry at all
    assert resolve_route(agent={**pinned, "retry_attempts": 50}).policy.retry_attempts == 5  # the cap
