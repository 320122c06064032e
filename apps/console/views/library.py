"""Library: agents, skills, MCP servers, schedules and webhooks with their versions, lineage
and a diff between two versions; create, fork, promote, retire and verify a content hash.

Every op goes through the def op-dispatch service that `POST /v1/_<kind>def` calls
(apps.substrate.services.def_dispatch, with the same operator-plane author), so what it
refuses is refused here with REST's status, code and text; reads are REST's ops too
(`list`, `get`: another tenant's def_id is a 404, a secret the caller does not own is masked).
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from apps.console.diffs import definition_diff
from apps.console.pages import console_view, render_page
from apps.core.errors import ApplicationError, NotFound
from apps.core.types import Principal
from apps.substrate import selectors, services
from apps.substrate.kinds import KINDS, REFUSALS, Kind, Refusal

LABELS = {
    "agent": "Agents",
    "skill": "Skills",
    "mcpserver": "MCP servers",
    "schedule": "Schedules",
    "webhook": "Webhooks",
}
LINEAGE_MAX_HOPS = 50
DEF_ID = r"^def_[A-Za-z0-9_-]{1,120}$"


def kind_of(key: str) -> Kind:
    if key not in KINDS:
        raise NotFound(f"unknown definition kind {key[:40]!r} (one of {', '.join(KINDS)})", code="not_found")
    return KINDS[key]


def dispatch(kind: Kind, principal: Principal, data: dict[str, Any]) -> dict[str, Any]:
    """One op as `POST /v1/_<kind>def` runs it. Raises a Refusal."""
    return services.def_dispatch(kind, services.operator_author(principal), data)


def refused(exc: Refusal) -> str:
    return f"{exc.code}: {exc.message}"


# --- forms ------------------------------------------------------------------------


class CreateForm(forms.Form):
    op = forms.CharField(initial="create", widget=forms.HiddenInput)
    name = forms.CharField(label="Name", max_length=128)
    description = forms.CharField(label="Description", required=False, max_length=4000)
    definition = forms.JSONField(label="Definition (JSON object)", initial=dict, widget=forms.Textarea({"rows": 8}))
    promote = forms.BooleanField(label="Make it the active version", required=False, initial=True)


class ForkForm(forms.Form):
    op = forms.CharField(initial="fork", widget=forms.HiddenInput)
    parent_def_id = forms.RegexField(
        label="Parent version (def_id; empty: the active one)", regex=DEF_ID, required=False
    )
    description = forms.CharField(label="Description", required=False, max_length=4000)
    overlay = forms.JSONField(
        label="Changes (JSON object; null removes a field)", initial=dict, widget=forms.Textarea({"rows": 6})
    )
    promote = forms.BooleanField(label="Make it the active version", required=False)


class VersionOpForm(forms.Form):
    op = forms.ChoiceField(choices=[("promote", "promote"), ("retire", "retire")])
    def_id = forms.RegexField(regex=DEF_ID)
    retired = forms.BooleanField(required=False)


class VerifyForm(forms.Form):
    op = forms.CharField(initial="verify", widget=forms.HiddenInput)
    content_sha256 = forms.CharField(label="Content hash (sha256:<hex>)", max_length=100)


class DiffForm(forms.Form):
    a = forms.RegexField(label="From version", regex=DEF_ID)
    b = forms.RegexField(label="To version", regex=DEF_ID)


def _op_data(form: forms.Form, name: str) -> dict[str, Any]:
    """The op-dispatch body of a valid form: REST's fields, nothing else."""
    data = {k: v for k, v in form.cleaned_data.items() if v not in ("", None)}
    op = data["op"]
    if op == "create":
        definition = data.pop("definition")
        data["overlay"] = definition
    if op in ("create", "fork", "verify"):
        data["name"] = name
    if op == "retire":
        data["retired"] = form.cleaned_data["retired"]
    elif op == "promote":
        data.pop("retired", None)
    if op in ("create", "fork"):
        data["promote"] = form.cleaned_data["promote"]
    return data


# --- the kind's page: names and the create form ---------------------------------------


@console_view(rest="* /v1/_{kind}def/names")  # GET: the names route's rule; POST (create): the op route's
def library_kind(request: HttpRequest, principal: Principal, kind: str) -> HttpResponse:
    k = kind_of(kind)
    form = CreateForm(request.POST or None)
    status, error = 200, ""
    if request.method == "POST":
        if not form.is_valid():
            status = 400
        elif not isinstance(form.cleaned_data["definition"], dict):
            form.add_error("definition", "the definition must be a JSON object")
            status = 400
        else:
            name = form.cleaned_data["name"]
            try:
                out = dispatch(k, principal, _op_data(form, name))
            except REFUSALS as exc:
                status, error = exc.status, refused(exc)
            else:
                messages.success(request, f"created {out['name']} v{out['version']} ({out['def_id']})")
                return redirect(reverse("console:library-def", args=[kind, out["name"]]))
    names = selectors.def_names(k, tenant_id=principal.read_tenant)
    ctx = {"kind": kind, "kind_label": LABELS[kind], "kinds": LABELS, "names": names, "form": form, "error": error}
    return render_page(request, principal, "console/library/kind.html", ctx, status=status)


@console_view(rest="GET /v1/_agentdef/names")
def library(request: HttpRequest, principal: Principal) -> HttpResponse:
    """The library's first page: agents."""
    return redirect(reverse("console:library-kind", args=["agent"]))


# --- one name: versions, lineage, diff, and the version ops ---------------------------

OP_FORMS: dict[str, type[forms.Form]] = {
    "fork": ForkForm,
    "promote": VersionOpForm,
    "retire": VersionOpForm,
    "verify": VerifyForm,
}


def as_error(exc: Refusal) -> ApplicationError:
    """A refusal as the error page shows it: REST's status and code."""
    err = ApplicationError(exc.message, code=exc.code)
    err.status = exc.status
    return err


def done_text(op: str, out: dict[str, Any]) -> str:
    if op == "fork":
        return f"forked v{out['version']} ({out['def_id']}) from {out['parent_def_id']}"
    if op == "promote":
        return f"{out['def_id']} is the active version"
    return f"{out['def_id']} {'retired' if out['retired'] else 'un-retired'}"


def lineage(kind: Kind, principal: Principal, start: dict[str, Any], known: dict[str, Any]) -> list[dict[str, Any]]:
    """`start` and its parents, nearest first: versions of this name, then any the caller may
    `get` (a shared or yaml root); the chain stops at a parent the caller cannot see."""
    chain, current = [start], start
    for _ in range(LINEAGE_MAX_HOPS):
        parent_id = current["parent_def_id"]
        if not parent_id:
            break
        parent = known.get(parent_id)
        if parent is None:
            try:
                parent = dispatch(kind, principal, {"op": "get", "def_id": parent_id})
            except REFUSALS:
                break
        chain.append(parent)
        current = parent
    return chain


def diff_of(kind: Kind, principal: Principal, form: DiffForm) -> list[Any]:
    """The two versions through REST's `get` (masked as REST masks them), diffed."""
    a = dispatch(kind, principal, {"op": "get", "def_id": form.cleaned_data["a"]})
    b = dispatch(kind, principal, {"op": "get", "def_id": form.cleaned_data["b"]})
    return definition_diff(a["definition"], b["definition"], old_label=f"v{a['version']}", new_label=f"v{b['version']}")


def _run_op(request: HttpRequest, principal: Principal, kind: Kind, name: str) -> tuple[int, str, dict[str, Any]]:
    """(status, error, op output) of the posted op."""
    op = request.POST.get("op", "")
    form_class = OP_FORMS.get(op)
    if form_class is None:
        return 400, f"unknown op {op[:20]!r} (one of {', '.join(OP_FORMS)})", {}
    form = form_class(request.POST)
    if not form.is_valid():
        problems = "; ".join(f"{field}: {' '.join(str(e) for e in errs)}" for field, errs in form.errors.items())
        return 400, f"invalid_request: {problems}", {}
    if op == "fork" and not isinstance(form.cleaned_data["overlay"], dict):
        return 400, "invalid_request: overlay: the changes must be a JSON object", {}
    try:
        return 200, "", dispatch(kind, principal, _op_data(form, name))
    except REFUSALS as exc:
        return exc.status, refused(exc), {}


def _page_context(request: HttpRequest, principal: Principal, kind: Kind, name: str) -> dict[str, Any]:
    versions = dispatch(kind, principal, {"op": "list", "name": name})["versions"]
    resolved = selectors.def_resolve(kind, tenant_id=principal.tenant_id, name=name)
    resolves_to = dispatch(kind, principal, {"op": "get", "def_id": resolved.id}) if resolved is not None else None
    known = {v["def_id"]: v for v in versions}
    wanted = request.GET.get("v", "")
    start = known.get(wanted) or next((v for v in versions if v.get("promoted")), None)
    start = start or (versions[0] if versions else resolves_to)
    choices = list(versions) + ([resolves_to] if resolves_to and resolves_to["def_id"] not in known else [])
    diff_form = DiffForm(request.GET if "a" in request.GET else None, initial=_diff_initial(choices))
    return {
        "versions": versions,
        "resolves_to": resolves_to,
        "lineage": lineage(kind, principal, start, known) if start else [],
        "choices": choices,
        "diff_form": diff_form,
        "diff": diff_of(kind, principal, diff_form) if diff_form.is_bound and diff_form.is_valid() else None,
    }


def _diff_initial(choices: list[dict[str, Any]]) -> dict[str, str]:
    """The newest version against its parent (or the one before it)."""
    if len(choices) < 2:
        return {}
    newest = choices[0]
    return {"a": newest["parent_def_id"] or choices[1]["def_id"], "b": newest["def_id"]}


@console_view(rest="POST /v1/_{kind}def")  # its reads are the `list` and `get` ops: the op route's rule
def library_def(request: HttpRequest, principal: Principal, kind: str, name: str) -> HttpResponse:
    k = kind_of(kind)
    status, error, verified = 200, "", None
    if request.method == "POST":
        status, error, out = _run_op(request, principal, k, name)
        if out and request.POST["op"] == "verify":
            verified = out
        elif out:
            messages.success(request, done_text(request.POST["op"], out))
            return redirect(request.get_full_path())
    try:
        ctx = _page_context(request, principal, k, name)
    except REFUSALS as exc:
        raise as_error(exc) from exc
    ctx |= {"kind": kind, "kind_label": LABELS[kind], "kinds": LABELS, "name": name, "error": error}
    ctx |= {"verified": verified, "fork_form": ForkForm(), "verify_form": VerifyForm()}
    return render_page(request, principal, "console/library/def.html", ctx, status=status)
