"""The `Skill` tool and Context's `agents`, `skills` and `help` ops (issue 20,
part 4): called as the engine calls them (a ToolContext of a yaml agent)
against real Postgres, and through real runs of `mock-script` agents on real
workers. Test agents and skills: tests/loomcycle.test.yaml."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from importlib import resources
from typing import Any

import pytest
from django.conf import settings

from apps.core import toolregistry as registry
from apps.core.tools import ToolContext, ToolResult
from apps.runs import helptopics, services
from apps.runs.models import Run, RunEvent, RunStatus
from apps.runs.prompt import Segment
from apps.runs.tools import context_execute
from apps.substrate.kinds import get_kind
from apps.substrate.selectors import agent_def_resolve, skill_resolve
from apps.substrate.services import Author, def_dispatch
from tests.conftest import ALICE, wait_status
from tests.procs import WorkerPool

pytestmark = pytest.mark.usefixtures("agents")

ACME = Author(tenant_id="acme", subject="alice")
BETA = Author(tenant_id="beta", subject="charlie")
SHARED_SKILLS = ["style-brief", "style-wide", "terse-answers"]  # `skilled` may use these; hidden-skill it may not


def ctx(agent: str = "skilled", tenant_id: str = "", tools: tuple[str, ...] | None = None) -> ToolContext:
    row = agent_def_resolve(tenant_id=tenant_id, name=agent)
    return ToolContext(
        run_id="r_0000000000000001",
        agent_id="a_0000000000000001",
        session_id="s_0000000000000001",
        tenant_id=tenant_id,
        user_id="u1",
        agent_name=agent,
        agent_def_id=row.id,
        agent_def_sha256=row.content_sha256,
        provider="mock",
        model="mock-script",
        step=0,
        call_id="c1",
        tools=tools if tools is not None else ("Agent", "Context", "Skill"),
        cancelled=threading.Event(),
    )


def skill(data: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
    """One call of the registered `Skill` tool, as the engine makes it."""
    tool = registry.get("Skill")
    assert tool is not None
    return tool.execute(context or ctx(), data)


def refused(result: ToolResult, needle: str) -> None:
    assert result.is_error is True, result.text
    assert needle in result.text, result.text
    assert result.events == ()


def listed(context: ToolContext | None = None, **data: Any) -> list[str]:
    result = skill({"op": "list", **data}, context)
    assert result.is_error is False, result.text
    return [s["name"] for s in json.loads(result.text)["skills"]]


def create_skill(author: Author, name: str, body: str, **overlay: Any) -> dict[str, Any]:
    return def_dispatch(get_kind("skill"), author, {"op": "create", "name": name, "overlay": {"body": body, **overlay}})


# --- Skill op=list -------------------------------------------------------------------


def test_list_shows_the_allowed_skills_with_their_descriptions() -> None:
    result = skill({"op": "list"})
    out = json.loads(result.text)
    assert out["count"] == 3
    assert out["skills"][0] == {"name": "style-brief", "description": "Keep answers brief."}
    assert [s["name"] for s in out["skills"]] == SHARED_SKILLS


def test_list_pattern_filters_within_the_allowlist() -> None:
    assert listed(pattern="style-*") == ["style-brief", "style-wide"]
    assert listed(pattern="terse-answers") == ["terse-answers"]
    assert listed(pattern="hidden-*") == []  # a filter never widens the allowlist


def test_an_agent_without_skills_allowlist_lists_nothing() -> None:
    assert listed(ctx("unskilled")) == []
    assert listed(ctx("skills-off")) == []


# --- Skill op=invoke ----------------------------------------------------------------


def test_invoke_returns_the_body_and_records_the_version_on_an_event() -> None:
    result = skill({"op": "invoke", "name": "style-brief"})
    assert result.is_error is False, result.text
    assert result.text == "Answer in at most two sentences."  # the stored body (trailing newline trimmed)
    row = skill_resolve(tenant_id="", name="style-brief")
    assert row is not None and row.content_sha256.startswith("sha256:")
    assert result.events == (
        {
            "type": "skill_loaded",
            "skill": {
                "name": "style-brief",
                "def_id": row.id,
                "version": row.version,
                "content_sha256": row.content_sha256,
                "tenant_id": "",
                "source": "yaml",
            },
        },
    )


def test_a_name_alone_invokes() -> None:
    assert skill({"name": "terse-answers"}).text == "Answer in one short sentence. No preamble, no lists."


def test_invoke_outside_the_allowlist_is_refused() -> None:
    refused(skill({"op": "invoke", "name": "hidden-skill"}), "not permitted by this agent's `skills:` allowlist")


def test_an_agent_without_skills_is_refused_every_skill() -> None:
    refused(skill({"name": "style-brief"}, ctx("unskilled")), "not permitted")
    refused(skill({"name": "style-brief"}, ctx("skills-off")), "not permitted")


def test_unknown_skill_names_the_available_ones() -> None:
    result = skill({"op": "invoke", "name": "style-missing"})
    refused(result, "unknown skill 'style-missing'")
    assert "(available: style-brief, style-wide, terse-answers)" in result.text
    assert "hidden-skill" not in result.text


def test_a_skill_needing_tools_the_run_lacks_is_refused() -> None:
    refused(skill({"name": "style-wide"}), "needs tools ['Memory'] this run does not have")
    assert skill({"name": "style-wide"}, ctx(tools=("Context", "Memory", "Skill"))).is_error is False


def test_a_skill_tool_glob_is_covered_only_by_every_registered_match() -> None:
    create_skill(ACME, "style-con", "Uses Context.", tools=["Con*"])
    create_skill(ACME, "style-ag", "Uses agents.", tools=["Ag*"])  # Agent and AgentDef
    acme = ctx(tenant_id="acme")
    assert skill({"name": "style-con"}, acme).is_error is False
    refused(skill({"name": "style-ag"}, acme), "needs tools ['Ag*']")
    assert skill({"name": "style-ag"}, replace(acme, tools=("Agent", "AgentDef", "Skill"))).is_error is False


def test_bad_input_is_refused() -> None:
    refused(skill({"op": "run", "name": "style-brief"}), "unknown op 'run'; this runtime supports invoke, list")
    refused(skill({"op": "invoke"}), "invoke needs `name`")
    refused(skill({"op": "invoke", "name": "style-brief", "colour": 1}), "unknown fields ['colour']")
    refused(skill({"op": "list", "pattern": 3}), "pattern must be a string")


# --- tenants and retirement ----------------------------------------------------------


def test_a_tenants_skill_is_invisible_to_another_tenant() -> None:
    create_skill(ACME, "style-acme", "Acme house style.")
    assert "style-acme" in listed(ctx(tenant_id="acme"))
    assert skill({"name": "style-acme"}, ctx(tenant_id="acme")).text == "Acme house style."
    assert "style-acme" not in listed(ctx(tenant_id="beta"))
    refused(skill({"name": "style-acme"}, ctx(tenant_id="beta")), "unknown skill 'style-acme'")
    refused(skill({"name": "style-acme"}, ctx(tenant_id="")), "unknown skill 'style-acme'")


def test_a_tenants_own_version_wins_over_the_shared_one_for_that_tenant_only() -> None:
    body = {"op": "fork", "name": "style-brief", "overlay": {"body": "Acme: one sentence."}, "promote": True}
    created = def_dispatch(get_kind("skill"), ACME, body)
    mine = skill({"name": "style-brief"}, ctx(tenant_id="acme"))
    assert mine.text == "Acme: one sentence."
    assert mine.events[0]["skill"]["def_id"] == created["def_id"]
    assert mine.events[0]["skill"]["tenant_id"] == "acme"
    assert mine.events[0]["skill"]["content_sha256"] == created["content_sha256"]
    assert skill({"name": "style-brief"}, ctx(tenant_id="beta")).text == "Answer in at most two sentences."


def test_a_promoted_shared_fork_wins_over_the_yaml_skill() -> None:
    ops = Author(tenant_id="", subject="ops", is_admin=True)
    fork = def_dispatch(
        get_kind("skill"), ops, {"op": "fork", "name": "terse-answers", "overlay": {"body": "v2"}, "promote": True}
    )
    result = skill({"name": "terse-answers"}, ctx(tenant_id="beta"))
    assert result.text == "v2"
    assert (result.events[0]["skill"]["def_id"], result.events[0]["skill"]["source"]) == (fork["def_id"], "runtime")


def test_a_retired_skill_cannot_be_loaded_or_listed() -> None:
    created = create_skill(BETA, "style-old", "Old style.")
    def_dispatch(get_kind("skill"), BETA, {"op": "retire", "def_id": created["def_id"], "retired": True})
    result = skill({"name": "style-old"}, ctx(tenant_id="beta"))
    refused(result, "skill 'style-old' has no active version (retired, or never promoted)")
    assert "style-old" not in listed(ctx(tenant_id="beta"))


# --- auto-add and narrowing (the registry) --------------------------------------------


def eff(agent: list[str], skills: list[str] | None, caller: list[str] | None = None) -> list[str]:
    return registry.effective_tools(operator=["*"], agent=agent, caller=caller, skills=skills)


def test_skill_is_added_when_the_agent_may_use_a_skill() -> None:
    assert eff(["Agent"], ["style-*"]) == ["Agent", "Context", "Skill"]
    assert eff([], ["*"]) == ["Context", "Skill"]


def test_skill_is_not_added_without_skills_or_with_only_minus_star() -> None:
    assert eff(["Agent"], None) == ["Agent", "Context"]
    assert eff(["Agent"], []) == ["Agent", "Context"]
    assert eff(["Agent"], ["-*"]) == ["Agent", "Context"]


def test_the_caller_and_the_operator_can_still_exclude_skill() -> None:
    assert eff(["Agent"], ["*"], caller=["Agent", "Context"]) == ["Agent", "Context"]
    floor = registry.effective_tools(operator=["Context"], agent=[], caller=None, skills=["*"])
    assert floor == ["Context"]


def test_a_run_of_a_skilled_agent_gets_skill_unless_the_caller_narrows() -> None:
    run = services.run_resolve(tenant_id="", data=services.RunCreate(agent="skilled", segments=[Segment(text="x")]))
    assert run.tools == ["Agent", "Context", "Skill"]
    narrow = services.RunCreate(agent="skilled", segments=[Segment(text="x")], tools=["Context"])
    assert services.run_resolve(tenant_id="", data=narrow).tools == ["Context"]
    plain = services.RunCreate(agent="unskilled", segments=[Segment(text="x")])
    assert services.run_resolve(tenant_id="", data=plain).tools == ["Context"]


# --- Context agents / skills / help ---------------------------------------------------


def context(data: dict[str, Any], context: ToolContext | None = None) -> Any:
    result = context_execute(context or ctx(), data)
    assert result.is_error is False, result.text
    return json.loads(result.text)


def test_context_agents_lists_the_tenants_agents_as_they_resolve() -> None:
    out = context({"op": "agents", "prefix": "skill"})
    assert [a["name"] for a in out["agents"]] == ["skilled", "skills-off"]
    first = out["agents"][0]
    row = agent_def_resolve(tenant_id="", name="skilled")
    assert first == {
        "name": "skilled",
        "description": "may use the style-* skills and terse-answers; holds Context and Agent",
        "def_id": row.id,
        "version": row.version,
        "tenant_id": "",
        "tools_count": 2,
        "provider": "mock",
        "model": "mock-script",
    }
    assert out["can_spawn"] is True
    assert context({"op": "agents", "prefix": "skill"}, ctx("unskilled", tools=("Context",)))["can_spawn"] is False


def test_context_agents_never_shows_another_tenants_agent() -> None:
    body = {"op": "create", "name": "acme-helper", "overlay": {"provider": "mock", "model": "mock-generic"}}
    def_dispatch(get_kind("agent"), ACME, body)
    assert [a["name"] for a in context({"op": "agents", "prefix": "acme-"}, ctx(tenant_id="acme"))["agents"]] == [
        "acme-helper"
    ]
    assert context({"op": "agents", "prefix": "acme-"}, ctx(tenant_id="beta"))["agents"] == []
    assert context({"op": "agents", "prefix": "acme-"})["count"] == 0


def test_context_skills_matches_skill_list_and_shows_the_allowlist() -> None:
    out = context({"op": "skills"})
    assert [s["name"] for s in out["skills"]] == SHARED_SKILLS
    assert out["allowlist"] == ["style-*", "terse-answers"]
    assert out["skill_tool"] is True
    assert [s["name"] for s in context({"op": "skills", "pattern": "terse*"})["skills"]] == ["terse-answers"]
    none = context({"op": "skills"}, ctx("unskilled", tools=("Context",)))
    assert (none["skills"], none["allowlist"], none["skill_tool"]) == ([], [], False)


def test_help_index_lists_every_bundled_topic_file() -> None:
    folder = resources.files("apps.runs").joinpath("help")
    files = sorted(p.name.removesuffix(".md") for p in folder.iterdir() if p.name.endswith(".md"))
    assert {"tools", "memory", "channels", "skills", "limits"} <= set(files)
    out = context({"op": "help"})
    assert [t["name"] for t in out["topics"]] == files
    assert out["count"] == len(files)
    assert all(t["description"] for t in out["topics"])


@pytest.mark.parametrize("name", [t.name for t in helptopics.topics()])
def test_every_topic_is_served_with_its_file_content(name: str) -> None:
    out = context({"op": "help", "topic": name})
    text = resources.files("apps.runs").joinpath("help", f"{name}.md").read_text(encoding="utf-8")
    assert out["name"] == name
    assert out["content"].strip() == text.partition("\n")[2].strip()
    assert text.startswith(f"description: {out['description']}\n")


def test_an_unknown_topic_lists_the_valid_ones() -> None:
    result = context_execute(ctx(), {"op": "help", "topic": "nope"})
    assert result.is_error is True
    valid = ", ".join(t.name for t in helptopics.topics())
    assert result.text == f"help: topic 'nope' not found (available: {valid})"


def test_a_help_query_is_refused_not_ignored() -> None:
    result = context_execute(ctx(), {"op": "help", "query": "how do channels work"})
    assert result.is_error is True
    assert result.text == "help: query is not supported by this runtime; omit topic for the index"


def test_the_help_files_are_package_data() -> None:
    pyproject = (settings.BASE_DIR / "pyproject.toml").read_text()
    assert '"apps.runs" = ["help/*.md"]' in pyproject


def test_context_refuses_unknown_ops_naming_the_new_ones() -> None:
    result = context_execute(ctx(), {"op": "lineage"})
    assert result.is_error is True
    ops = "self, tools, time, history, agents, skills, help, compact"
    assert result.text == f"unknown op 'lineage'; expected one of {ops}"


# --- through a real run -----------------------------------------------------------------


def scripted(steps: list[dict[str, Any]], agent: str = "skilled", **kw: Any) -> Run:
    prompt = f"Use a skill. MOCK_SCRIPT: {json.dumps(steps)}"
    data = services.RunCreate(agent=agent, segments=[Segment(text=prompt)], **kw)
    return services.run_create(principal=ALICE, data=data)


def events(run_id: str, *types: str) -> list[dict[str, Any]]:
    rows = RunEvent.objects.filter(run_id=run_id).order_by("seq")
    return [{"type": e.type, **e.payload} for e in rows if e.type in types]


def test_a_run_lists_and_loads_a_skill_and_records_the_version(stack: WorkerPool) -> None:
    run = scripted(
        [
            {"tool": "Skill", "input": {"op": "list"}},
            {"tool": "Skill", "input": {"op": "invoke", "name": "style-brief"}},
            {"tool": "Skill", "input": {"op": "invoke", "name": "hidden-skill"}},
            {"text": "done"},
        ]
    )
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert Run.objects.get(id=run.id).tools == ["Agent", "Context", "Skill"]
    results = events(run.id, "tool_result")
    assert [r["is_error"] for r in results] == [False, False, True]
    assert [s["name"] for s in json.loads(results[0]["text"])["skills"]] == SHARED_SKILLS
    assert results[1]["text"] == "Answer in at most two sentences."
    assert "not permitted" in results[2]["text"]
    row = skill_resolve(tenant_id="", name="style-brief")
    assert row is not None
    (loaded,) = events(run.id, "skill_loaded")
    assert loaded["skill"]["def_id"] == row.id
    assert loaded["skill"]["content_sha256"] == row.content_sha256
    order = [e["type"] for e in events(run.id, "skill_loaded", "tool_result")]
    assert order == ["tool_result", "skill_loaded", "tool_result", "tool_result"]  # the event precedes its result


def test_a_caller_who_narrows_out_skill_gets_a_refused_call(stack: WorkerPool) -> None:
    run = scripted([{"tool": "Skill", "input": {"name": "style-brief"}}, {"text": "done"}], tools=["Context"])
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    assert Run.objects.get(id=run.id).tools == ["Context"]
    (result,) = events(run.id, "tool_result")
    assert result["is_error"] is True
    assert result["text"] == "tool 'Skill' is not allowed for this run"
    assert events(run.id, "skill_loaded") == []


def test_context_help_through_a_run(stack: WorkerPool) -> None:
    run = scripted([{"tool": "Context", "input": {"op": "help", "topic": "skills"}}, {"text": "done"}])
    wait_status(run.id, RunStatus.COMPLETED, timeout=30)
    (result,) = events(run.id, "tool_result")
    assert result["is_error"] is False
    assert json.loads(result["text"])["name"] == "skills"
