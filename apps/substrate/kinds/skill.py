"""The SkillDef kind: a skill's fields, how they are validated and normalised."""

from __future__ import annotations

from typing import Any

from apps.substrate import hashing
from apps.substrate.kinds.base import VERSIONED_OPS, Kind, Refused, drop_unknown, string_list
from apps.substrate.models import SkillDef, SkillDefActive

SKILL_FIELDS = frozenset({"body", "description", "tools"})


def normalise_skill(name: str, raw: dict[str, Any], strict: bool) -> dict[str, Any]:
    raw = dict(raw)
    raw.pop("name", None)
    definition = drop_unknown(name, "skill", raw, SKILL_FIELDS, strict)
    body = definition.get("body")
    if not isinstance(body, str) or not body.strip():
        raise Refused(f"skill {name!r}: body is required and must be non-empty text")
    definition["body"] = hashing.normalise_text(body)
    if not isinstance(definition.get("description", ""), str):
        raise Refused(f"skill {name!r}: description must be text")
    definition["tools"] = string_list(definition.get("tools"), f"skill {name!r}: tools")
    return definition


SKILL = Kind(
    key="skill",
    tool="SkillDef",
    model=SkillDef,
    pointer=SkillDefActive,
    ops=VERSIONED_OPS,
    normalise=normalise_skill,
    content_hash=hashing.skill_content_sha256,
    agent_callable=True,
    yaml_key="skills",
    tools_field="tools",
)
