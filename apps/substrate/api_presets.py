"""The embedded configuration units, read over HTTP (SPEC 2.2: `/v1/_presets[/{name}]`,
`/v1/_env_template`): what `loomcycle presets` and `loomcycle env-template` print,
for a deployment with no shell. substrate:admin, as every `/v1/_*` route not
opened to tenants (auth.BearerAuth)."""

from __future__ import annotations

from django.http import HttpRequest
from ninja import Router
from pydantic import BaseModel

from apps.core import presets

router = Router(tags=["config"])


class UnitOut(BaseModel):
    name: str
    kind: str
    description: str


class UnitsOut(BaseModel):
    units: list[UnitOut]


class UnitYamlOut(BaseModel):
    name: str
    yaml: str


class EnvTemplateOut(BaseModel):
    env: str


@router.get("/_presets", summary="The embedded presets and bundles LOOMCYCLE_PRESETS selects from", response=UnitsOut)
def presets_list(request: HttpRequest) -> dict[str, list[dict[str, str]]]:
    units = [{"name": u.name, "kind": u.kind, "description": u.description} for u in presets.units_list()]
    return {"units": units}


@router.get("/_presets/{name}", summary="One embedded preset or bundle, as the yaml it layers", response=UnitYamlOut)
def presets_show(request: HttpRequest, name: str) -> dict[str, str]:
    return {"name": name, "yaml": presets.unit_get(name).text}


@router.get(
    "/_env_template",
    summary="The runtime's non-secret environment variables with their defaults",
    response=EnvTemplateOut,
)
def env_template(request: HttpRequest) -> dict[str, str]:
    return {"env": presets.env_template()}
