"""`load_config` layering/expansion, yaml agent sync and agent def resolution."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apps.core.config import load_config
from apps.core.errors import Invalid, NotFound
from apps.core.ids import new_def_id
from apps.substrate.models import AgentDef, AgentDefActive, DefSource
from apps.substrate.selectors import agent_def_resolve
from apps.substrate.services import agent_def_sync_static, agent_defs_load_yaml


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- load_config ----------------------------------------------------------------


def test_later_files_override_earlier_scalars_and_merge_nested_mappings(tmp_path: Path) -> None:
    base = write(tmp_path, "a.yaml", "x: 1\nkeep: base\nagents:\n  a: {provider: mock, model: m1}\n  b: {model: b}\n")
    top = write(tmp_path, "b.yaml", "x: 2\nagents:\n  a: {model: m2}\n  c: {model: c}\n")
    assert load_config([base, top]) == {
        "x": 2,
        "keep": "base",
        "agents": {"a": {"provider": "mock", "model": "m2"}, "b": {"model": "b"}, "c": {"model": "c"}},
    }


def test_lists_and_non_mapping_values_are_replaced_not_merged(tmp_path: Path) -> None:
    base = write(tmp_path, "a.yaml", "tools: [A, B]\nsection: {k: v}\n")
    top = write(tmp_path, "b.yaml", "tools: [C]\nsection: plain\n")
    assert load_config([base, top]) == {"tools": ["C"], "section": "plain"}


def test_no_files_and_empty_file_give_empty_config(tmp_path: Path) -> None:
    assert load_config([]) == {}
    assert load_config([write(tmp_path, "empty.yaml", "# only a comment\n")]) == {}


def test_env_references_are_expanded_in_nested_strings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_TEST_HOST", "db.internal")
    monkeypatch.setenv("_LC_TEST_2", "two")
    path = write(tmp_path, "c.yaml", "url: 'pg://${LC_TEST_HOST}:5432/${_LC_TEST_2}'\nlist:\n  - a-${LC_TEST_HOST}\n")
    assert load_config([path]) == {"url": "pg://db.internal:5432/two", "list": ["a-db.internal"]}


def test_unset_env_reference_expands_to_empty_or_its_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LC_TEST_UNSET", raising=False)
    monkeypatch.setenv("LC_TEST_SET", "real")
    path = write(
        tmp_path,
        "c.yaml",
        "a: '[${LC_TEST_UNSET}]'\nb: ${LC_TEST_UNSET:-fallback}\n"
        "c: ${LC_TEST_SET:-fallback}\nd: '[${LC_TEST_UNSET:-}]'\n",
    )
    assert load_config([path]) == {"a": "[]", "b": "fallback", "c": "real", "d": "[]"}


def test_env_default_applies_when_variable_is_set_but_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_TEST_EMPTY", "")
    assert load_config([write(tmp_path, "c.yaml", "v: ${LC_TEST_EMPTY:-fallback}\n")]) == {"v": "fallback"}


def test_only_identifier_shaped_references_are_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_TEST_V", "x")
    text = "a: '${1BAD}'\nb: '${A-B}'\nc: '$LC_TEST_V'\nd: '${}'\ne: '${LC_TEST_V}'\n"
    assert load_config([write(tmp_path, "c.yaml", text)]) == {
        "a": "${1BAD}",
        "b": "${A-B}",
        "c": "$LC_TEST_V",
        "d": "${}",
        "e": "x",
    }


def test_expanded_values_are_not_reparsed_as_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LC_TEST_INJECT", "a\nb: c")
    assert load_config([write(tmp_path, "c.yaml", "v: ${LC_TEST_INJECT}\n")]) == {"v": "a\nb: c"}


def test_missing_file_is_config_not_found(tmp_path: Path) -> None:
    ok = write(tmp_path, "ok.yaml", "a: 1\n")
    with pytest.raises(Invalid) as exc:
        load_config([ok, tmp_path / "nope.yaml"])
    assert exc.value.code == "config_not_found"
    assert "nope.yaml" in exc.value.message


def test_invalid_yaml_is_config_invalid(tmp_path: Path) -> None:
    with pytest.raises(Invalid) as exc:
        load_config([write(tmp_path, "bad.yaml", "a: [1, 2\nb: {")])
    assert exc.value.code == "config_invalid"
    assert "invalid yaml" in exc.value.message


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_non_mapping_is_config_invalid(tmp_path: Path, text: str) -> None:
    with pytest.raises(Invalid) as exc:
        load_config([write(tmp_path, "list.yaml", text)])
    assert exc.value.code == "config_invalid"
    assert "mapping" in exc.value.message


# --- agent_def_sync_static / agent_defs_load_yaml ----------------------------------

RAW: dict[str, Any] = {"provider": "mock", "model": "mock-generic", "system_prompt": "Be terse.", "tools": []}


def active(name: str, tenant: str = "") -> AgentDef:
    return AgentDefActive.objects.select_related("active_def").get(tenant_id=tenant, name=name).active_def


@pytest.mark.django_db
def test_first_sync_creates_version_1_from_yaml_and_activates_it() -> None:
    d = agent_def_sync_static(name="t-sync", raw=dict(RAW, description="hello"))
    assert (d.version, d.parent_id, d.tenant_id, d.source) == (1, None, "", DefSource.YAML)
    assert d.id.startswith("def_")
    assert d.content_sha256.startswith("sha256:")
    assert d.description == "hello"
    assert d.definition["model"] == "mock-generic"
    assert active("t-sync") == d


@pytest.mark.django_db
def test_resyncing_identical_content_returns_the_same_def() -> None:
    first = agent_def_sync_static(name="t-same", raw=dict(RAW))
    again = agent_def_sync_static(name="t-same", raw=dict(RAW, system_prompt="Be terse.\r\n"))
    assert again.id == first.id
    assert AgentDef.objects.filter(name="t-same").count() == 1


@pytest.mark.django_db
def test_changed_content_creates_next_version_with_parent_and_moves_active_pointer() -> None:
    v1 = agent_def_sync_static(name="t-change", raw=dict(RAW))
    v2 = agent_def_sync_static(name="t-change", raw=dict(RAW, system_prompt="Be verbose."))
    assert (v2.version, v2.parent_id) == (2, v1.id)
    assert v2.content_sha256 != v1.content_sha256
    assert active("t-change") == v2
    assert AgentDefActive.objects.filter(tenant_id="", name="t-change").count() == 1
    v1.refresh_from_db()
    assert v1.definition["system_prompt"] == "Be terse."


@pytest.mark.django_db
def test_reverting_to_earlier_content_reactivates_that_version_without_a_new_one() -> None:
    v1 = agent_def_sync_static(name="t-revert", raw=dict(RAW))
    agent_def_sync_static(name="t-revert", raw=dict(RAW, max_iterations=3))
    back = agent_def_sync_static(name="t-revert", raw=dict(RAW))
    assert back.id == v1.id
    assert active("t-revert") == v1
    assert AgentDef.objects.filter(name="t-revert").count() == 2


@pytest.mark.parametrize("flag", ["disable_context", "interactive"])
@pytest.mark.django_db
def test_changing_a_behavioural_flag_in_yaml_takes_effect(flag: str) -> None:
    agent_def_sync_static(name="t-flag", raw=dict(RAW))
    synced = agent_def_sync_static(name="t-flag", raw={**RAW, flag: True})
    assert synced.definition.get(flag) is True


@pytest.mark.django_db
def test_comma_string_tools_are_normalised_to_a_list() -> None:
    d = agent_def_sync_static(name="t-tools", raw=dict(RAW, tools=" Context, Read ,,Write "))
    assert d.definition["tools"] == ["Context", "Read", "Write"]
    listed = agent_def_sync_static(name="t-tools", raw=dict(RAW, tools=["Context", "Read", "Write"]))
    assert listed.id == d.id


@pytest.mark.django_db
def test_unknown_fields_are_dropped_from_the_stored_definition() -> None:
    d = agent_def_sync_static(name="t-unknown", raw=dict(RAW, future_knob=1))
    assert "future_knob" not in d.definition


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("t-bad", {"model": "mock-generic"}),
        ("t-bad", {"provider": "mock"}),
        ("t-bad", {"provider": "", "model": "mock-generic"}),
        ("t-bad", dict(RAW, tier="fast")),
        ("t-bad", dict(RAW, tools=[1, 2])),
        ("t-bad", dict(RAW, tools={"Context": True})),
        ("t-bad", dict(RAW, max_iterations=0)),
        ("t-bad", dict(RAW, max_iterations="8")),
        ("t-bad", ["not", "a", "mapping"]),
        ("bad name", dict(RAW)),
        ("bad.name", dict(RAW)),
        ("", dict(RAW)),
        ("x" * 129, dict(RAW)),
    ],
)
@pytest.mark.django_db
def test_invalid_entries_are_config_invalid_and_store_nothing(name: str, raw: Any) -> None:
    with pytest.raises(Invalid) as exc:
        agent_def_sync_static(name=name, raw=raw)
    assert exc.value.code == "config_invalid"
    assert not AgentDef.objects.filter(name=name).exists()


@pytest.mark.django_db
def test_load_yaml_syncs_every_agent_and_rejects_non_mapping_agents() -> None:
    defs = agent_defs_load_yaml(config={"agents": {"t-y1": dict(RAW), "t-y2": dict(RAW, model="mock-tool-loop")}})
    assert [d.name for d in defs] == ["t-y1", "t-y2"]
    assert [active(n).id for n in ("t-y1", "t-y2")] == [d.id for d in defs]
    assert agent_defs_load_yaml(config={}) == []
    with pytest.raises(Invalid) as exc:
        agent_defs_load_yaml(config={"agents": ["t-y1"]})
    assert exc.value.code == "config_invalid"


# --- agent_def_resolve ----------------------------------------------------------


def tenant_def(tenant: str, name: str, *, retired: bool = False) -> AgentDef:
    d = AgentDef.objects.create(
        id=new_def_id(),
        tenant_id=tenant,
        name=name,
        version=1,
        definition=dict(RAW),
        content_sha256="sha256:" + "0" * 64,
        retired=retired,
    )
    AgentDefActive.objects.create(tenant_id=tenant, name=name, active_def=d)
    return d


@pytest.mark.django_db
def test_resolve_prefers_the_tenant_active_def_over_the_shared_one() -> None:
    shared = agent_def_sync_static(name="t-res", raw=dict(RAW))
    mine = tenant_def("acme", "t-res")
    assert agent_def_resolve(tenant_id="acme", name="t-res") == mine
    assert agent_def_resolve(tenant_id="other", name="t-res") == shared
    assert agent_def_resolve(tenant_id="", name="t-res") == shared


@pytest.mark.django_db
def test_resolve_without_tenant_ignores_tenant_defs() -> None:
    tenant_def("acme", "t-only-acme")
    with pytest.raises(NotFound):
        agent_def_resolve(tenant_id="", name="t-only-acme")


@pytest.mark.django_db
def test_retired_active_def_is_not_found() -> None:
    tenant_def("", "t-retired", retired=True)
    with pytest.raises(NotFound) as exc:
        agent_def_resolve(tenant_id="", name="t-retired")
    assert exc.value.code == "unknown_agent"


@pytest.mark.django_db
def test_unknown_agent_is_not_found() -> None:
    with pytest.raises(NotFound) as exc:
        agent_def_resolve(tenant_id="acme", name="t-nobody")
    assert (exc.value.status, exc.value.code) == (404, "unknown_agent")
    assert "t-nobody" in exc.value.message
