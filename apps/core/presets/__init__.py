"""Embedded configuration units (loomcycle's presets and bundles, SPEC C.1).

The runtime ships a few yaml layers in `units/`, named `<name>.<kind>.yaml`:
a *preset* is routing only (model aliases, provider order, tiers, user tiers;
no agents, no secrets), a *bundle* carries agents and leans on a preset for
routing. `LOOMCYCLE_PRESETS=base,chat` selects them by name; they are layered
in that order beneath every file the operator loads (apps.core.config), so an
operator file changes any of their fields by naming it. A name is unique across
both kinds; an unknown name stops the boot with the names there are.

`env.example` is the catalogue of the runtime's non-secret environment
variables with their defaults (GET /v1/_env_template); a test keeps it equal to
what loomcycle_project/env.py reads.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from apps.core.errors import Invalid, NotFound

UNITS_DIR = Path(__file__).resolve().parent / "units"
ENV_TEMPLATE = Path(__file__).resolve().parent / "env.example"
KINDS = ("preset", "bundle")


@dataclass(frozen=True)
class Unit:
    name: str
    kind: str  # "preset" | "bundle"
    description: str  # the first comment line of the file
    text: str  # the yaml as shipped

    @property
    def label(self) -> str:
        """How config errors and the override log name this layer."""
        return f"{self.kind}:{self.name}"


def _description(text: str) -> str:
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            return ""
        if body := stripped.lstrip("#").strip():
            return body
    return ""


@functools.cache
def _registry() -> dict[str, Unit]:
    out: dict[str, Unit] = {}
    for path in sorted(UNITS_DIR.glob("*.yaml")):
        name, kind, _ = path.name.rsplit(".", 2)
        if kind not in KINDS or name in out:
            raise RuntimeError(f"embedded unit {path.name}: a kind of {KINDS} and a name used once")
        text = path.read_text()
        out[name] = Unit(name=name, kind=kind, description=_description(text), text=text)
    return out


def units_list() -> list[Unit]:
    """Every embedded unit, by name."""
    return list(_registry().values())


def unit_get(name: str) -> Unit:
    """One unit (404 `unknown_preset`, naming the ones there are)."""
    unit = _registry().get(name)
    if unit is None:
        raise NotFound(f"unknown preset or bundle {name!r} (there are: {_names()})", code="unknown_preset")
    return unit


def units_resolve(names: tuple[str, ...] | list[str]) -> list[Unit]:
    """The selected units in selection order (= layer order). An unknown name is a
    configuration error (`config_invalid`): a typo must not boot without its layer."""
    registry = _registry()
    unknown = [n for n in names if n not in registry]
    if unknown:
        raise Invalid(
            f"LOOMCYCLE_PRESETS names unknown preset(s) {', '.join(unknown)} (there are: {_names()})",
            code="config_invalid",
        )
    return [registry[n] for n in names]


def env_template() -> str:
    return ENV_TEMPLATE.read_text()


def _names() -> str:
    return ", ".join(_registry())
