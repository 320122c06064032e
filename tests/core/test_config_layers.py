"""Config layering (issue 17): LOOMCYCLE_CONFIG_FILES as a `:` or `,` list,
LOOMCYCLE_CONFIG_DIR before it, every replaced value logged, and
LOOMCYCLE_CONFIG_STRICT turning a replacement into a `config_conflict`."""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from apps.core.config import default_config_paths, load_config, runtime_config
from apps.core.errors import Invalid
from loomcycle_project.env import split_paths
from tests.procs import ROOT

BASE = """\
defaults: {model: base-model, effort: low}
provider_priority: [anthropic, openai]
listen: a
agents:
  doc: {system_prompt: from-base, tier: middle}
"""
SITE = """\
defaults: {model: site-model}
provider_priority: [deepseek]
agents:
  doc: {system_prompt: from-site}
  guru: {tier: high}
"""
MERGED = {
    "defaults": {"model": "site-model", "effort": "low"},  # mapping ⊕ mapping: keys merge
    "provider_priority": ["deepseek"],  # a sequence is replaced, not appended
    "listen": "a",
    "agents": {"doc": {"system_prompt": "from-site", "tier": "middle"}, "guru": {"tier": "high"}},
}
REPLACED = ["defaults.model", "provider_priority", "agents.doc.system_prompt"]


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text)
    return path


def use(settings: Any, **fields: Any) -> None:
    """Point settings.LOOMCYCLE's config fields at a test's files."""
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, **fields)


def replaced_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "loomcycle.config" and r.levelno == logging.INFO]


# --- the list ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a.yaml:b.yaml", ["a.yaml", "b.yaml"]),
        ("a.yaml,b.yaml", ["a.yaml", "b.yaml"]),
        (" a.yaml : b.yaml,c.yaml ", ["a.yaml", "b.yaml", "c.yaml"]),
        ("::a.yaml,,:b.yaml:", ["a.yaml", "b.yaml"]),
        ("", []),
    ],
)
def test_config_files_split_on_colons_and_commas_dropping_empty_items(raw: str, expected: list[str]) -> None:
    assert split_paths(raw) == expected


@pytest.mark.parametrize("sep", [":", ","])
def test_a_list_of_two_files_layers_mappings_merged_scalars_and_sequences_replaced(
    tmp_path: Path, settings: Any, sep: str
) -> None:
    base, site = write(tmp_path, "base.yaml", BASE), write(tmp_path, "site.yaml", SITE)
    use(settings, config_files=tuple(split_paths(f"{base}{sep}{site}")), config_dir="", config_strict=False)
    assert runtime_config(reload=True) == MERGED


def test_a_merge_into_an_aliased_mapping_leaves_its_alias_alone(tmp_path: Path) -> None:
    base = write(tmp_path, "a.yaml", "one: &shared {model: m1}\ntwo: *shared\n")
    top = write(tmp_path, "b.yaml", "one: {model: m2}\n")
    assert load_config([base, top]) == {"one": {"model": "m2"}, "two": {"model": "m1"}}


# --- LOOMCYCLE_CONFIG_DIR -----------------------------------------------------------------


def test_dir_files_come_sorted_by_name_before_the_listed_files(tmp_path: Path, settings: Any) -> None:
    conf = tmp_path / "conf.d"
    write(conf, "20-b.yml", "order: [dir-b]\nb: 1\n")
    write(conf, "10-a.yaml", "order: [dir-a]\na: 1\n")
    write(conf, "notes.txt", "not: yaml\n")
    write(conf / "sub", "30-ignored.yaml", "ignored: true\n")
    last = write(tmp_path, "last.yaml", "order: [file]\n")
    assert default_config_paths(tmp_path, [str(last)], str(conf)) == [conf / "10-a.yaml", conf / "20-b.yml", last]
    use(settings, config_files=(str(last),), config_dir=str(conf), config_strict=False)
    assert runtime_config(reload=True) == {"order": ["file"], "a": 1, "b": 1}


def test_dir_alone_replaces_the_default_file_and_an_empty_dir_leaves_it(tmp_path: Path) -> None:
    write(tmp_path, "loomcycle.yaml", "default: true\n")
    conf = tmp_path / "conf.d"
    conf.mkdir()
    assert default_config_paths(tmp_path, [], str(conf)) == [tmp_path / "loomcycle.yaml"]
    write(conf, "a.yaml", "a: 1\n")
    assert default_config_paths(tmp_path, [], str(conf)) == [conf / "a.yaml"]


def test_a_missing_dir_is_config_not_found_naming_it(tmp_path: Path, settings: Any) -> None:
    use(settings, config_files=(), config_dir=str(tmp_path / "nope"), config_strict=False)
    with pytest.raises(Invalid) as exc:
        runtime_config(reload=True)
    assert exc.value.code == "config_not_found"
    assert exc.value.message == f"LOOMCYCLE_CONFIG_DIR is not a directory: {tmp_path / 'nope'}"


# --- replaced values: logged, or refused under strict ----------------------------------------


def test_each_replaced_value_is_logged_once_with_both_files_and_no_value(
    tmp_path: Path, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    base, site = write(tmp_path, "base.yaml", BASE), write(tmp_path, "site.yaml", SITE)
    use(settings, config_files=(str(base), str(site)), config_dir="", config_strict=False)
    with caplog.at_level(logging.INFO, logger="loomcycle.config"):
        runtime_config(reload=True)
        runtime_config()  # cached: read, and logged, once
    assert sorted(replaced_lines(caplog)) == sorted(
        f"config layers: {key} set in {base} is replaced by {site}" for key in REPLACED
    )
    assert not any("site-model" in line or "deepseek" in line for line in replaced_lines(caplog))


def test_a_mapping_replaced_by_a_scalar_names_every_file_that_set_it(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", "section: {x: 1}\n")
    b = write(tmp_path, "b.yaml", "section: {y: 2}\n")
    c = write(tmp_path, "c.yaml", "section: off\n")
    with pytest.raises(Invalid) as exc:
        load_config([a, b, c], strict=True)
    assert exc.value.details == {"conflicts": [{"key": "section", "earlier": [str(a), str(b)], "later": str(c)}]}


def test_strict_refuses_a_conflict_naming_the_key_and_both_files(tmp_path: Path, settings: Any) -> None:
    f1 = write(tmp_path, "f1.yaml", "defaults:\n  model: m1\n  effort: low\n")
    f2 = write(tmp_path, "f2.yaml", "defaults:\n  model: m2\n")
    use(settings, config_files=(str(f1), str(f2)), config_dir="", config_strict=True)
    with pytest.raises(Invalid) as exc:
        runtime_config(reload=True)
    assert exc.value.code == "config_conflict"
    assert exc.value.message == (
        "LOOMCYCLE_CONFIG_STRICT is set and a later file changes 1 value(s): "
        f"defaults.model: set in {f1}, replaced by {f2}"
    )
    assert "m1" not in exc.value.message and "m2" not in exc.value.message


def test_strict_accepts_equal_values_and_new_keys_but_not_a_changed_type(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = write(tmp_path, "a.yaml", "listen: '127.0.0.1:8787'\ntools: [A]\nagents: {x: {tier: low}}\n")
    b = write(tmp_path, "b.yaml", "listen: '127.0.0.1:8787'\ntools: [A]\nagents: {y: {tier: high}}\n")
    with caplog.at_level(logging.INFO, logger="loomcycle.config"):
        merged = load_config([a, b], strict=True)
    assert merged["agents"] == {"x": {"tier": "low"}, "y": {"tier": "high"}}
    assert replaced_lines(caplog) == []
    flag = write(tmp_path, "c.yaml", "flag: 1\n")
    with pytest.raises(Invalid, match=r"flag: set in .*c\.yaml, replaced by .*d\.yaml"):
        load_config([flag, write(tmp_path, "d.yaml", "flag: true\n")], strict=True)


# --- a real process ---------------------------------------------------------------------------


def test_manage_py_doctor_reads_a_colon_list(stack_env: dict[str, str], tmp_path: Path) -> None:
    site = write(tmp_path, "site.yaml", "agents:\n  layered-extra: {provider: mock, model: mock-generic}\n")
    files = f"{ROOT / 'loomcycle.yaml'}:{site}"
    env = {**stack_env, "LOOMCYCLE_CONFIG_FILES": files, "LOOMCYCLE_CONFIG_STRICT": "1"}
    env.pop("LOOMCYCLE_CONFIG_DIR", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "doctor"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert f"PASS config: {ROOT / 'loomcycle.yaml'}, {site}:" in done.stdout, done.stdout + done.stderr
    assert "FAIL" not in done.stdout and done.returncode == 0


def test_manage_py_boot_under_strict_prints_the_conflict_without_a_traceback(
    stack_env: dict[str, str], tmp_path: Path
) -> None:
    f1 = write(tmp_path, "f1.yaml", "defaults: {model: m1}\n")
    f2 = write(tmp_path, "f2.yaml", "defaults: {model: m2}\n")
    env = {**stack_env, "LOOMCYCLE_CONFIG_FILES": f"{f1}:{f2}", "LOOMCYCLE_CONFIG_STRICT": "1"}
    done = subprocess.run(
        [sys.executable, "manage.py", "boot"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert "CommandError: config_conflict: LOOMCYCLE_CONFIG_STRICT is set" in done.stderr
    assert f"defaults.model: set in {f1}, replaced by {f2}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_yaml_error_names_the_problem_and_place_but_never_quotes_the_line(tmp_path: Path) -> None:
    broken = tmp_path / "secrets.yaml"
    broken.write_text('providers:\n  vllm:\n    api_key: "sk-live-do-not-print\n  other: [\n')
    with pytest.raises(Invalid) as exc:
        load_config([broken])
    assert exc.value.code == "config_invalid"
    assert "sk-live-do-not-print" not in exc.value.message
    assert "line" in exc.value.message and str(broken) in exc.value.message


# --- !prepend / !append (loomcycle's RFC AQ sequence tags) ---------------------------------


def test_prepend_composes_in_front_and_is_not_a_replacement(tmp_path: Path, settings: Any) -> None:
    base = write(tmp_path, "a.yaml", "provider_priority: [deepseek, openai, anthropic]\n")
    over = write(tmp_path, "b.yaml", "provider_priority: !prepend [anthropic-oauth, anthropic]\n")
    use(settings, config_strict=True)  # a compose is not a conflict, even under strict
    assert load_config([base, over], strict=True) == {
        "provider_priority": ["anthropic-oauth", "anthropic", "deepseek", "openai"]  # a repeat kept once, first
    }


def test_append_composes_after_keeping_the_first_of_a_repeat(tmp_path: Path) -> None:
    base = write(tmp_path, "a.yaml", "tiers:\n  middle: [deepseek-pro, {provider: openai, model: m}]\n")
    over = write(tmp_path, "b.yaml", "tiers:\n  middle: !append [{provider: openai, model: m}, ollama]\n")
    assert load_config([base, over]) == {
        "tiers": {"middle": ["deepseek-pro", {"provider": "openai", "model": "m"}, "ollama"]}
    }


def test_a_tagged_sequence_over_nothing_is_set_and_an_untagged_one_still_replaces(tmp_path: Path) -> None:
    first = write(tmp_path, "a.yaml", "tools: !append [A]\n")
    second = write(tmp_path, "b.yaml", "tools: !append [B]\n")
    third = write(tmp_path, "c.yaml", "tools: [C]\n")
    assert load_config([first]) == {"tools": ["A"]}
    assert load_config([first, second]) == {"tools": ["A", "B"]}
    assert load_config([first, second, third]) == {"tools": ["C"]}


def test_a_tag_on_a_scalar_is_config_invalid_naming_the_file_and_line(tmp_path: Path) -> None:
    bad = write(tmp_path, "a.yaml", "x: 1\ntools: !prepend A\n")
    with pytest.raises(Invalid) as caught:
        load_config([bad])
    assert caught.value.code == "config_invalid"
    assert str(bad) in caught.value.message and "line 2" in caught.value.message
