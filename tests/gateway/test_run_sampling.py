"""A run request's `sampling` reaches each provider's request body at the wire (issue 35,
section 2): one run per driver (Anthropic, OpenAI, Gemini, Ollama) against the loopback
server speaking its protocol (tests/gateway/wire.py, recorded text answers), the engine's
iteration in this process. A knob the provider's API has no field for is not sent, and
the run says so in a `capability_inert` event at its start."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer

from apps.gateway.providers import registry
from apps.gateway.providers.anthropic import AnthropicProtocol
from apps.runs import engine, services
from apps.runs.models import RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.runs.run_options import RunOptions
from apps.substrate.kinds import get_kind
from apps.substrate.services import Author, def_create
from tests.conftest import ALICE, run_row
from tests.gateway.wire import Wire, serve

FIXTURES = Path(__file__).parent / "fixtures"
SAMPLING = {
    "temperature": 0.0,
    "top_p": 0.5,
    "top_k": 7,
    "frequency_penalty": 0.25,
    "presence_penalty": -0.5,
    "seed": 42,
    "stop": ["END"],
}
GEMINI_MODEL = "gemini-2.5-flash"
# driver -> (path, content type, recorded answer, base path, model)
DRIVERS = {
    "openai": ("/v1/chat/completions", "text/event-stream", "openai/text.sse", "/v1", "gpt-test"),
    "anthropic": ("/v1/messages", "text/event-stream", "anthropic/text.sse", "", "claude-test"),
    "gemini": (
        f"/v1beta/models/{GEMINI_MODEL}:streamGenerateContent",
        "text/event-stream",
        "gemini/text.sse",
        "/v1beta",
        GEMINI_MODEL,
    ),
    "ollama": ("/api/chat", "application/x-ndjson", "ollama/text.ndjson", "", "llama-test"),
}


@pytest.fixture
def wires(
    server: HTTPServer, settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[dict[str, Wire]]:
    """One endpoint per driver on the loopback server, a yaml provider `wire-<driver>` for each."""
    monkeypatch.setenv("LOOMCYCLE_TEST_WIRE_KEY", "k")
    gens = {d: serve(server, path, ctype) for d, (path, ctype, _, _, _) in DRIVERS.items()}
    endpoints = {d: next(g) for d, g in gens.items()}
    lines = ["providers:"]
    for driver, (_, _, _, base, _) in DRIVERS.items():
        lines += [
            f"  wire-{driver}:",
            f"    driver: {driver}",
            f"    base_url: {endpoints[driver].url}{base}",
            "    api_key_env: LOOMCYCLE_TEST_WIRE_KEY",
        ]
        if driver == "openai":
            lines.append("    dialect: openai")
    cfg = tmp_path / "wires.yaml"
    cfg.write_text("\n".join(lines) + "\n")
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, config_files=(*settings.LOOMCYCLE.config_files, str(cfg))
    )
    registry._providers.cache_clear()
    try:
        yield endpoints
    finally:
        registry._providers.cache_clear()
        for gen in gens.values():
            gen.close()


def _run(driver: str, wire: Wire) -> tuple[dict[str, Any], set[str]]:
    """Run an agent pinned to `wire-<driver>` with the request's SAMPLING: the body the provider
    got, and the knobs the run announced as not sent."""
    _, _, answer, _, model = DRIVERS[driver]
    wire.reply((FIXTURES / answer).read_bytes())
    author = Author(tenant_id="", subject="ops", is_admin=True)
    name = f"sampled-{driver}"
    def_create(get_kind("agent"), author, {"name": name, "overlay": {"provider": f"wire-{driver}", "model": model}})
    data = services.RunCreate(agent=name, segments=[Segment(text="hi")], options=RunOptions(sampling=SAMPLING))
    run = services.run_create(principal=ALICE, data=data)
    engine.run_iterate(run_id=run.id, step=0)
    assert run_row(run.id).status == RunStatus.COMPLETED, run_row(run.id).error
    events = RunEvent.objects.filter(run_id=run.id, type="capability_inert")
    announced = {e.payload["capability_inert"]["gate"].removeprefix("sampling.") for e in events}
    return wire.requests[-1], announced


@pytest.mark.usefixtures("agents", "no_workers")
def test_each_driver_sends_every_knob_its_api_has_and_announces_the_rest(wires: dict[str, Wire]) -> None:
    body, announced = _run("openai", wires["openai"])
    assert {k: body[k] for k in SAMPLING if k != "top_k"} == {k: v for k, v in SAMPLING.items() if k != "top_k"}
    assert "top_k" not in body and announced == {"top_k"}

    body, announced = _run("anthropic", wires["anthropic"])
    assert (body["temperature"], body["top_p"], body["top_k"], body["stop_sequences"]) == (0.0, 0.5, 7, ["END"])
    assert announced == {"frequency_penalty", "presence_penalty", "seed"}
    assert not announced & set(body)

    body, announced = _run("gemini", wires["gemini"])
    assert {k: body["generationConfig"][k] for k in ("temperature", "topP", "topK", "seed", "stopSequences")} == {
        "temperature": 0.0,
        "topP": 0.5,
        "topK": 7,
        "seed": 42,
        "stopSequences": ["END"],
    }
    assert (body["generationConfig"]["frequencyPenalty"], body["generationConfig"]["presencePenalty"]) == (0.25, -0.5)
    assert announced == set()

    body, announced = _run("ollama", wires["ollama"])
    assert {k: body["options"][k] for k in SAMPLING} == SAMPLING
    assert announced == set()


def test_anthropic_reports_what_extended_thinking_drops() -> None:
    protocol = AnthropicProtocol()
    knobs = {"temperature": 0.2, "top_p": 0.99, "top_k": 5, "seed": 1}
    assert protocol.unsent_sampling(knobs, "") == ["seed"]
    assert protocol.unsent_sampling(knobs, "high") == ["seed", "temperature", "top_k"]  # top_p >= 0.95 is kept
    assert protocol.unsent_sampling({**knobs, "top_p": 0.5}, "medium") == ["seed", "temperature", "top_k", "top_p"]
