"""Agents and skills as Markdown files (issue 40): LOOMCYCLE_AGENTS_ROOT/<name>.md and
LOOMCYCLE_SKILLS_ROOT/<name>/SKILL.md are loaded at boot as static definitions, under the
yaml (a yaml namesake overrides field by field), hashed as yaml entries are; a bad file
stops the load naming the file and line; `doctor` lists what was loaded."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from apps.core.errors import Invalid
from apps.substrate.models import AgentDef, AgentDefActive, DefSource, SkillDef
from loomcycle_project.bootstrap import load_yaml_config
from loomcycle_project.management.commands.doctor import check_markdown

AGENT_MD = """\
---
description: Reviews a diff.
provider: mock
model: mock-generic
tools: Read, Grep
max_iterations: 6
---
You review diffs. Be terse.
"""
SKILL_MD = """\
---
name: terse
description: Say less.
allowed-tools: [Read]
---
Answer in one sentence.
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def roots(settings: Any, tmp_path: Path, *yaml_files: Path) -> None:
    for sub in ("agents", "skills"):
        (tmp_path / sub).mkdir(exist_ok=True)
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE,
        agents_root=str(tmp_path / "agents"),
        skills_root=str(tmp_path / "skills"),
        config_files=tuple(str(p) for p in yaml_files) or settings.LOOMCYCLE.config_files,
    )


def active(name: str) -> AgentDef:
    pointer = AgentDefActive.objects.select_related("active_def").get(tenant_id="", name=name)
    assert pointer.active_def is not None
    return pointer.active_def


@pytest.mark.django_db
def test_markdown_agents_and_skills_load_at_boot_as_static_definitions(settings: Any, tmp_path: Path) -> None:
    write(tmp_path / "agents" / "md-reviewer.md", AGENT_MD)
    write(tmp_path / "agents" / "notes.txt", "not an agent")
    write(tmp_path / "skills" / "terse" / "SKILL.md", SKILL_MD)
    roots(settings, tmp_path)
    assert "md-reviewer" in {a.name for a in load_yaml_config()}
    row = active("md-reviewer")
    assert row.source == DefSource.YAML
    assert row.definition["system_prompt"] == "You review diffs. Be terse."
    assert row.definition["tools"] == ["Read", "Grep"]  # the Claude Code comma string
    assert row.definition["max_iterations"] == 6
    skill = SkillDef.objects.get(tenant_id="", name="terse", source=DefSource.YAML)
    assert skill.definition["body"] == "Answer in one sentence." and skill.definition["tools"] == ["Read"]


@pytest.mark.django_db
def test_a_markdown_agent_hashes_as_the_same_agent_written_in_yaml(settings: Any, tmp_path: Path) -> None:
    write(tmp_path / "agents" / "md-same.md", AGENT_MD)
    roots(settings, tmp_path)
    load_yaml_config()
    from_md = active("md-same")
    yaml_file = write(
        tmp_path / "same.yaml",
        "agents:\n  md-same:\n    description: Reviews a diff.\n    provider: mock\n    model: mock-generic\n"
        "    tools: [Read, Grep]\n    max_iterations: 6\n    system_prompt: |\n      You review diffs. Be terse.\n",
    )
    settings.LOOMCYCLE = dataclasses.replace(
        settings.LOOMCYCLE, agents_root="", skills_root="", config_files=(str(yaml_file),)
    )
    load_yaml_config()
    from_yaml = active("md-same")
    assert from_yaml.pk == from_md.pk  # the same content: the same static row, the same hash
    assert from_yaml.content_sha256 == from_md.content_sha256


@pytest.mark.django_db
def test_a_yaml_namesake_overrides_the_file_field_by_field(settings: Any, tmp_path: Path) -> None:
    write(tmp_path / "agents" / "md-over.md", AGENT_MD)
    over = write(tmp_path / "over.yaml", "agents:\n  md-over: {max_iterations: 3, tools: [Read]}\n")
    roots(settings, tmp_path, over)
    load_yaml_config()
    row = active("md-over")
    assert row.definition["max_iterations"] == 3 and row.definition["tools"] == ["Read"]
    assert row.definition["system_prompt"] == "You review diffs. Be terse."  # the body stays
    assert row.definition["model"] == "mock-generic"

    write(over, "agents:\n  md-over: {system_prompt: From yaml.}\n")
    load_yaml_config()
    assert active("md-over").definition["system_prompt"] == "From yaml."  # a yaml prompt replaces the body


@pytest.mark.django_db
def test_a_frontmatter_syntax_error_names_the_file_and_its_line(settings: Any, tmp_path: Path) -> None:
    bad = write(tmp_path / "agents" / "md-bad.md", "---\nprovider: mock\nmodel: [unclosed\n---\nHi.\n")
    roots(settings, tmp_path)
    with pytest.raises(Invalid) as caught:
        load_yaml_config()
    assert caught.value.code == "config_invalid"
    assert caught.value.message.startswith(f"{bad}:3: invalid frontmatter")  # the file's line, not the block's
    assert not AgentDefActive.objects.filter(name="md-bad").exists()


@pytest.mark.django_db
def test_a_refused_field_names_the_file_and_the_line_of_that_key(settings: Any, tmp_path: Path) -> None:
    bad = write(tmp_path / "agents" / "md-neg.md", "---\nprovider: mock\nmodel: m\nmax_tokens: -5\n---\nHi.\n")
    roots(settings, tmp_path)
    with pytest.raises(Invalid) as caught:
        load_yaml_config()
    assert caught.value.message == f"{bad}:4: agent 'md-neg': max_tokens must be a non-negative integer"


@pytest.mark.django_db
def test_an_unclosed_frontmatter_and_a_missing_root_are_refused(settings: Any, tmp_path: Path) -> None:
    bad = write(tmp_path / "agents" / "md-open.md", "---\nprovider: mock\nHi.\n")
    roots(settings, tmp_path)
    with pytest.raises(Invalid, match=rf"^{bad}:1: frontmatter has no closing ---"):
        load_yaml_config()
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, agents_root=str(tmp_path / "nowhere"))
    with pytest.raises(Invalid, match="LOOMCYCLE_AGENTS_ROOT is not a directory") as caught:
        load_yaml_config()
    assert caught.value.code == "config_not_found"


def test_doctor_lists_the_markdown_definitions_it_would_load(settings: Any, tmp_path: Path) -> None:
    write(tmp_path / "agents" / "md-doc.md", AGENT_MD)
    write(tmp_path / "skills" / "terse" / "SKILL.md", SKILL_MD)
    roots(settings, tmp_path)
    assert check_markdown() == [("PASS", "markdown defs", "1 agent(s) ['md-doc'], 1 skill(s) ['terse']")]
    write(tmp_path / "agents" / "md-doc.md", "---\nprovider: mock\nmodel: m\nmax_iterations: 0\n---\nx\n")
    [(level, _, detail)] = check_markdown()
    assert level == "FAIL" and f"{tmp_path / 'agents' / 'md-doc.md'}:4: " in detail
