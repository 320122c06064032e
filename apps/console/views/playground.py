"""Playground: start a chat with a named agent, or with an ad-hoc one (provider, model,
system prompt: a version of an AgentDef of the caller's tenant, created as
`POST /v1/_agentdef` op=create does, so a run still names an AgentDef), follow its tokens
live, steer it, cancel a turn, see usage and cost per turn, and continue a conversation from
the session list. Every action is the REST route's service: def_dispatch (POST
/v1/_agentdef), run_create (POST /v1/runs), run_input (POST /v1/runs/{id}/input),
run_turn_cancel (POST /v1/runs/{id}/cancel), session_continue (POST
/v1/sessions/{id}/messages)."""

from __future__ import annotations

from django import forms
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.console.pages import console_view, render_page
from apps.core.errors import ApplicationError, Invalid, Unprocessable
from apps.core.types import Principal
from apps.gateway.selectors import usage_by_step
from apps.runs import selectors, services
from apps.runs.engine.turncancel import run_turn_cancel
from apps.runs.prompt import Segment
from apps.runs.sessions.listing import SessionFilter, sessions_page
from apps.runs.sessions.services import session_continue
from apps.runs.statuses import TERMINAL
from apps.runs.timeline import timeline
from apps.substrate import selectors as defs
from apps.substrate import services as def_services
from apps.substrate.auth import authorize
from apps.substrate.kinds import KINDS, Refused

MESSAGE_MAX = 100_000


class StartForm(forms.Form):
    agent = forms.RegexField(label="Agent", regex=r"^[A-Za-z0-9_.:-]{1,128}$")
    message = forms.CharField(label="Message", max_length=MESSAGE_MAX, widget=forms.Textarea({"rows": 3}))


class AdHocForm(forms.Form):
    name = forms.RegexField(label="Agent name", regex=r"^[A-Za-z0-9_.:-]{1,128}$", initial="playground")
    provider = forms.RegexField(label="Provider", regex=r"^[A-Za-z0-9_.-]{1,64}$")
    model = forms.CharField(label="Model", max_length=256)
    system_prompt = forms.CharField(
        label="System prompt", max_length=MESSAGE_MAX, required=False, widget=forms.Textarea({"rows": 3})
    )
    message = forms.CharField(label="Message", max_length=MESSAGE_MAX, widget=forms.Textarea({"rows": 3}))


class MessageForm(forms.Form):
    message = forms.CharField(label="Message", max_length=MESSAGE_MAX, widget=forms.Textarea({"rows": 2}))


def _valid(form: forms.Form) -> dict[str, str]:
    if not form.is_valid():
        raise Invalid(
            "; ".join(f"{k}: {' '.join(str(e) for e in v)}" for k, v in form.errors.items()), code="invalid_request"
        )
    return dict(form.cleaned_data)


def _agent_names(principal: Principal) -> list[str]:
    """The agents this principal may list (GET /v1/_agentdef/names); none for an end user,
    who types the name (runs still check it)."""
    try:
        authorize(principal, "GET", "/v1/_agentdef/names")
    except ApplicationError:
        return []
    return sorted({row["name"] for row in defs.def_names(KINDS["agent"], tenant_id=principal.read_tenant)})


@console_view(rest="POST /v1/runs")
def playground(request: HttpRequest, principal: Principal) -> HttpResponse:
    wanted = SessionFilter(user_id=principal.read_user or "")
    sessions = sessions_page(tenant_id=principal.read_tenant, f=wanted, limit=20).sessions
    ctx = {
        "form": StartForm(),
        "adhoc": AdHocForm(auto_id="adhoc_%s"),
        "agents": _agent_names(principal),
        "sessions": sessions,
    }
    return render_page(request, principal, "console/playground/index.html", ctx)


@console_view(rest="POST /v1/_agentdef")
def playground_adhoc(request: HttpRequest, principal: Principal) -> HttpResponse:
    """A version of `name` with this provider, model and system prompt (identical content is
    the active version again, not a new one), promoted, then a chat with it."""
    data = _valid(AdHocForm(request.POST, auto_id="adhoc_%s"))
    overlay = {"provider": data["provider"], "model": data["model"], "system_prompt": data["system_prompt"]}
    op = {"op": "create", "name": data["name"], "overlay": overlay, "description": "made in the console's playground"}
    try:
        def_services.def_dispatch(KINDS["agent"], def_services.operator_author(principal), op)
    except Refused as exc:  # REST's answer to the same op: 422 (or the refusal's status) with its code
        raise Unprocessable(f"agent {data['name']!r}: {exc.message}", code=exc.code) from exc
    create = services.RunCreate(agent=data["name"], segments=[Segment(text=data["message"])], interactive=True)
    run = services.run_create(principal=principal, data=create)
    return redirect("console:chat", run_id=run.id)


@console_view(rest="POST /v1/runs")
def playground_start(request: HttpRequest, principal: Principal) -> HttpResponse:
    data = _valid(StartForm(request.POST))
    create = services.RunCreate(agent=data["agent"], segments=[Segment(text=data["message"])], interactive=True)
    run = services.run_create(principal=principal, data=create)
    return redirect("console:chat", run_id=run.id)


@console_view(rest="GET /v1/runs/{run_id}")
def chat(request: HttpRequest, principal: Principal, run_id: str) -> HttpResponse:
    run = selectors.run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    items = timeline(selectors.run_events_all(run_id=run.id, limit=2000))
    ctx = {
        "run": run,
        "items": items,
        "last_seq": items[-1].seq if items else 0,
        "live": run.status not in TERMINAL,
        "form": MessageForm(),
    }
    return render_page(request, principal, "console/playground/chat.html", ctx)


@console_view(rest="POST /v1/runs/{run_id}/input")
def chat_input(request: HttpRequest, principal: Principal, run_id: str) -> HttpResponse:
    data = _valid(MessageForm(request.POST))
    services.run_input(principal=principal, run_id=run_id, text=data["message"])
    return render_page(request, principal, "console/playground/_notice.html", {"notice": "sent"})


@console_view(rest="POST /v1/runs/{run_id}/cancel")
def chat_turn_cancel(request: HttpRequest, principal: Principal, run_id: str) -> HttpResponse:
    run_turn_cancel(principal=principal, run_id=run_id, reason="cancelled from the console")
    return render_page(request, principal, "console/playground/_notice.html", {"notice": "turn cancelled"})


@console_view(rest="GET /v1/runs/{run_id}")
def chat_usage(request: HttpRequest, principal: Principal, run_id: str) -> HttpResponse:
    run = selectors.run_get(tenant_id=principal.read_tenant, run_id=run_id, owner=principal.read_user)
    turns = sorted(usage_by_step(run_id=run.id).items())
    return render_page(request, principal, "console/playground/_usage.html", {"turns": turns})


@console_view(rest="POST /v1/sessions/{session_id}/messages")
def session_send(request: HttpRequest, principal: Principal, session_id: str) -> HttpResponse:
    data = _valid(MessageForm(request.POST))
    create = services.RunCreate(agent="", segments=[Segment(text=data["message"])], interactive=True)
    run = session_continue(principal=principal, session_id=session_id, data=create)
    return redirect("console:chat", run_id=run.id)
