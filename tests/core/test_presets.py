"""Embedded configuration units (apps.core.presets; SPEC C.1, 2.2): LOOMCYCLE_PRESETS layers
them in order beneath every file, an unknown name stops the boot, each shipped unit loads and
routes as boot would, and they are listed over HTTP (`/v1/_presets`, `/v1/_env_template`,
substrate:admin) and by `manage.py presets`."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.core.management import call_command

from apps.core import presets
from apps.core.config import load_config, runtime_config
from apps.core.errors import Invalid
from apps.gateway.providers.registry import has_provider
from apps.gateway.resolver import resolve_route
from apps.substrate import tokens
from loomcycle_project.bootstrap import load_yaml_config
from tests.core import env_template
from tests.procs import ROOT


def use(settings: Any, **fields: Any) -> None:
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, **fields)


def test_the_shipped_units_are_presets_and_bundles_each_described() -> None:
    kinds = {u.name: u.kind for u in presets.units_list()}
    assert kinds == {"base": "preset", "chat": "bundle", "local": "preset"}
    assert all(u.description and not u.description.startswith("#") for u in presets.units_list())


def test_units_layer_in_order_beneath_the_files_which_win(tmp_path: Path, settings: Any) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("models:\n  sonnet: {provider: anthropic, model: claude-sonnet-4-5}\ntiers:\n  low: [haiku]\n")
    use(settings, presets=("base", "local"), config_files=(str(site),), config_dir="")
    merged = runtime_config(reload=True)
    assert merged["provider_priority"] == ["ollama-local", "anthropic"]  # local's list replaced base's
    assert merged["models"]["gpt"] == {"provider": "openai", "model": "gpt-5"}  # base's alias kept
    assert merged["models"]["local-chat"]["provider"] == "ollama-local"  # local's alias added
    assert merged["models"]["sonnet"]["model"] == "claude-sonnet-4-5"  # the file wins over both
    assert merged["tiers"]["low"] == ["haiku"] and merged["tiers"]["high"][0] == "local-coder"


def test_strict_mode_names_the_unit_a_file_overrides(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("provider_priority: [anthropic]\n")
    with pytest.raises(Invalid) as info:
        load_config([site], strict=True, units=presets.units_resolve(["base"]))
    assert info.value.code == "config_conflict"
    assert f"provider_priority: set in preset:base, replaced by {site}" in info.value.message


def test_an_unknown_unit_is_a_config_error_naming_the_ones_there_are(settings: Any) -> None:
    use(settings, presets=("base", "bsae"))
    with pytest.raises(Invalid) as info:
        runtime_config(reload=True)
    assert info.value.code == "config_invalid"
    assert "unknown preset(s) bsae (there are: base, chat, local)" in info.value.message


@pytest.mark.django_db
def test_base_and_chat_alone_load_as_boot_loads_them_and_route_on_the_middle_tier(
    settings: Any, tmp_path: Path
) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")
    use(settings, presets=("base", "chat"), config_files=(str(empty),), config_dir="")
    agents = {a.name: a for a in load_yaml_config()}
    assistant = agents["assistant"].definition
    assert assistant["tier"] == "middle" and assistant["interactive"] is True
    got = [(c.provider, c.model) for c in resolve_route(agent=assistant).candidates]
    middle = [
        ("ollama-local", "qwen3:32b"),
        ("deepseek", "deepseek-chat"),
        ("gemini", "gemini-2.5-pro"),
        ("openai", "gpt-5"),
        ("anthropic", "claude-sonnet-4-6"),
    ]
    assert got and got == [c for c in middle if has_provider(c[0])]  # base's order, the usable ones


def test_the_env_template_is_what_env_py_reads_with_its_defaults() -> None:
    """Regenerate with `python -m tests.core.env_template` after adding a setting (and its docs row)."""
    assert presets.env_template() == env_template.generate()
    assert "UNDOCUMENTED" not in presets.env_template()
    assert "# LOOMCYCLE_PRESETS=\n" in presets.env_template()
    assert "# LOOMCYCLE_AUTH_TOKEN=" not in presets.env_template() and "# DATABASE_URL=" not in presets.env_template()


@pytest.mark.usefixtures("transactional_db")
def test_the_units_are_read_over_http_by_an_admin_only(http: httpx.Client, people: dict[str, dict[str, str]]) -> None:
    admin = tokens.token_create(name="presets-admin", tenant_id="ops", scopes=["substrate:admin"])["token"]
    ops = {"authorization": f"Bearer {admin}"}
    listed = http.get("/v1/_presets", headers=ops)
    assert listed.status_code == 200, listed.text
    assert {u["name"]: u["kind"] for u in listed.json()["units"]} == {
        "base": "preset",
        "chat": "bundle",
        "local": "preset",
    }
    shown = http.get("/v1/_presets/chat", headers=ops).json()
    assert shown == {"name": "chat", "yaml": presets.unit_get("chat").text}
    missing = http.get("/v1/_presets/nope", headers=ops)
    assert missing.status_code == 404 and missing.json()["code"] == "unknown_preset"
    assert http.get("/v1/_env_template", headers=ops).json() == {"env": presets.env_template()}
    for path in ("/v1/_presets", "/v1/_presets/base", "/v1/_env_template"):
        assert http.get(path, headers=people["alice"]).status_code == 403  # a tenant admin is not the operator


def test_manage_py_presets_lists_shows_and_prints_the_template() -> None:
    def run(*args: str) -> str:
        out = io.StringIO()
        call_command("presets", *args, stdout=out)
        return out.getvalue()

    assert [line.split()[:2] for line in run().splitlines()] == [
        ["base", "preset"],
        ["chat", "bundle"],
        ["local", "preset"],
    ]
    assert run("show", "local") == presets.unit_get("local").text
    assert run("env-template") == presets.env_template()


def test_manage_py_presets_names_an_unknown_unit_and_exits_1(stack_env: dict[str, str]) -> None:
    """The command as an operator runs it (its own process), for the exit status and message."""
    unknown = subprocess.run(
        [sys.executable, "manage.py", "presets", "show", "nope"],
        cwd=ROOT,
        env=stack_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        unknown.returncode == 1 and "unknown preset or bundle 'nope' (there are: base, chat, local)" in unknown.stderr
    )
