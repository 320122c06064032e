"""Django admin over the substrate: every write goes through the services
(create, fork, promote, retire, token mint/rotate/revoke), refusals come back
as form errors or messages, and every page renders."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib import messages
from django.contrib.admin.utils import quote
from django.contrib.messages import get_messages
from django.forms.models import model_to_dict
from django.test import Client
from django.test.client import RequestFactory
from django.urls import reverse

from apps.core.ids import new_def_id
from apps.substrate import services, tokens
from apps.substrate.kinds import KINDS, get_kind
from apps.substrate.models import AgentDef, AgentDefActive, ChannelDef, DefSource, OperatorTokenDef

pytestmark = pytest.mark.django_db

BASE = {"provider": "mock", "model": "mock-generic", "tools": ["Read", "Grep"], "system_prompt": "v1 prompt"}
AGENT_CHANGELIST = reverse("admin:substrate_agentdef_changelist")
AGENT = get_kind("agent")


def url(model: Any, view: str, *args: Any) -> str:
    opts = model._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=[quote(a) for a in args])


def texts(resp: Any) -> list[str]:
    return [str(m) for m in get_messages(resp.wsgi_request)]


def action(client: Client, action_name: str, *ids: str, **extra: Any) -> Any:
    data = {"action": action_name, "_selected_action": list(ids), **extra}
    if "post" not in extra:
        data["index"] = "0"  # the changelist's own action form; the fork page posts `post` instead
    return client.post(AGENT_CHANGELIST, data, follow=True)


def create(client: Client, name: str, definition: dict[str, Any], /, **fields: Any) -> Any:
    data = {"name": name, "tenant_id": "", "definition": json.dumps(definition), "description": "", "promote": "on"}
    return client.post(url(AgentDef, "add"), {**data, **fields})


def form_errors(resp: Any) -> str:
    return " | ".join(str(e) for errs in resp.context["form"].errors.values() for e in errs)


def active_id(tenant_id: str, name: str) -> str | None:
    return AgentDefActive.objects.get(tenant_id=tenant_id, name=name).active_def_id


# --- the lifecycle -------------------------------------------------------------------------


def test_agentdef_lifecycle_through_admin(admin_client: Client) -> None:
    assert admin_client.get(url(AgentDef, "add")).status_code == 200
    resp = create(admin_client, "researcher", BASE, description="first")
    v1 = AgentDef.objects.get(name="researcher", version=1)
    assert resp.status_code == 302 and resp["Location"] == url(AgentDef, "change", v1.id)
    assert (v1.tenant_id, v1.source, v1.created_by, v1.parent_id) == ("", DefSource.RUNTIME, "admin:admin", None)
    assert v1.content_sha256.startswith("sha256:") and v1.description == "first"
    assert active_id("", "researcher") == v1.id

    page = action(admin_client, "fork_selected", v1.id)  # the intermediate page, prefilled
    assert page.status_code == 200 and page.templates[0].name == "admin/substrate/def_form.html"
    assert json.loads(page.context["form"].initial["definition"]) == v1.definition
    assert page.context["form"].initial["promote"] is False  # AgentDef fork does not promote by default
    narrowed = {**v1.definition, "tools": ["Read"], "system_prompt": "v2 prompt"}
    resp = action(admin_client, "fork_selected", v1.id, post="yes", tenant_id="", definition=json.dumps(narrowed))
    v2 = AgentDef.objects.get(name="researcher", version=2)
    assert resp.redirect_chain[-1][0] == url(AgentDef, "change", v2.id)
    assert (v2.parent_id, v2.definition["tools"], v2.definition["system_prompt"]) == (v1.id, ["Read"], "v2 prompt")
    assert active_id("", "researcher") == v1.id  # unpromoted
    assert any("forked from" in m and "not promoted" in m for m in texts(resp))

    resp = action(admin_client, "promote_selected", v2.id)
    assert active_id("", "researcher") == v2.id
    resp = action(admin_client, "promote_selected", v1.id)
    assert active_id("", "researcher") == v1.id and any("promoted" in m for m in texts(resp))
    assert AgentDefActive.objects.get(name="researcher").promoted_by == "admin:admin"

    resp = action(admin_client, "retire_selected", v2.id)
    assert AgentDef.objects.get(id=v2.id).retired and any("retired" in m for m in texts(resp))

    listing = admin_client.get(AGENT_CHANGELIST, {"q": "researcher"})
    rows = list(listing.context["cl"].result_list)
    assert [(r.version, r.retired, r.is_active_flag, r.parent_id) for r in rows] == [
        (2, True, False, v1.id),
        (1, False, True, None),
    ]
    html = listing.content.decode()
    assert "(shared)" in html and v1.content_sha256[7:19] in html and url(AgentDef, "change", v1.id) in html

    resp = action(admin_client, "unretire_selected", v2.id)
    assert not AgentDef.objects.get(id=v2.id).retired


def test_change_page_is_read_only_and_shows_lineage_definition_and_status(admin_client: Client) -> None:
    create(admin_client, "lineage", BASE)
    author = services.Author(tenant_id="", subject="t", is_admin=True)
    v1 = AgentDef.objects.get(name="lineage")
    v2 = services.def_fork(AGENT, author, {"name": "lineage", "parent_def_id": v1.id, "overlay": {"tools": ["Read"]}})
    v3 = services.def_fork(AGENT, author, {"name": "lineage", "parent_def_id": v2["def_id"]})
    page = admin_client.get(url(AgentDef, "change", v2["def_id"]))
    html = page.content.decode()
    assert page.status_code == 200 and 'name="_save"' not in html
    assert url(AgentDef, "change", v1.id) in html and url(AgentDef, "change", v3["def_id"]) in html
    assert "&quot;tools&quot;: [\n    &quot;Read&quot;\n  ]" in html  # pretty-printed definition
    assert "not active" in html
    root = admin_client.get(url(AgentDef, "change", v1.id)).content.decode()
    assert "root (no parent)" in root and "active" in root

    assert admin_client.post(url(AgentDef, "change", v1.id), {"name": "x"}).status_code == 403
    assert AgentDef.objects.get(id=v1.id).name == "lineage"


# --- refusals ---------------------------------------------------------------------------------


def test_retire_of_a_yaml_row_is_refused_with_a_message(admin_client: Client) -> None:
    row = services.def_sync_static(AGENT, name="from-yaml", raw=BASE)
    listing = admin_client.get(AGENT_CHANGELIST, {"q": "from-yaml"})
    assert [r.is_static_flag for r in listing.context["cl"].result_list] == [True]
    resp = action(admin_client, "retire_selected", row.id)
    assert resp.status_code == 200
    assert any("refused" in m and "static yaml entry" in m for m in texts(resp))
    assert not AgentDef.objects.get(id=row.id).retired


def test_fork_that_widens_tools_is_refused_on_the_form(admin_client: Client) -> None:
    create(admin_client, "narrow", BASE)
    v1 = AgentDef.objects.get(name="narrow")
    wider = {**BASE, "tools": ["Read", "Grep", "Bash"]}
    resp = action(admin_client, "fork_selected", v1.id, post="yes", tenant_id="", definition=json.dumps(wider))
    assert resp.status_code == 200 and resp.templates[0].name == "admin/substrate/def_form.html"
    assert "tools cannot widen" in form_errors(resp)
    assert AgentDef.objects.filter(name="narrow").count() == 1


def test_fork_refuses_removing_a_field_instead_of_silently_keeping_it(admin_client: Client) -> None:
    create(admin_client, "keep", BASE)
    v1 = AgentDef.objects.get(name="keep")
    smaller = {k: v for k, v in BASE.items() if k != "system_prompt"}
    resp = action(admin_client, "fork_selected", v1.id, post="yes", tenant_id="", definition=json.dumps(smaller))
    assert "cannot be removed (system_prompt)" in form_errors(resp)
    assert AgentDef.objects.filter(name="keep").count() == 1


def test_fork_needs_exactly_one_selected_row(admin_client: Client) -> None:
    create(admin_client, "two", BASE)
    create(admin_client, "two", {**BASE, "system_prompt": "other"})
    ids = list(AgentDef.objects.filter(name="two").values_list("id", flat=True))
    resp = action(admin_client, "fork_selected", *ids)
    assert any("select exactly one" in m for m in texts(resp))
    assert AgentDef.objects.filter(name="two").count() == 2


def test_promote_refuses_two_versions_of_one_name(admin_client: Client) -> None:
    create(admin_client, "pair", BASE)
    create(admin_client, "pair", {**BASE, "system_prompt": "v2"})
    v1, v2 = AgentDef.objects.filter(name="pair").order_by("version")
    resp = action(admin_client, "promote_selected", v1.id, v2.id)
    assert sum("select one version per name" in m for m in texts(resp)) == 2
    assert active_id("", "pair") == v2.id


def test_promote_of_a_retired_row_is_refused(admin_client: Client) -> None:
    create(admin_client, "old", BASE)
    create(admin_client, "old", {**BASE, "system_prompt": "v2"})
    v1 = AgentDef.objects.get(name="old", version=1)
    action(admin_client, "retire_selected", v1.id)
    resp = action(admin_client, "promote_selected", v1.id)
    assert any("is retired" in m for m in texts(resp))
    assert active_id("", "old") != v1.id


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"definition": "{not json"}, "not valid JSON"),
        ({"definition": "[1, 2]"}, "must be a JSON object"),
        ({"tenant_id": "bad tenant!"}, "tenant id must match"),
        ({"name": "a/../b"}, "each '/'-separated segment"),
        ({"definition": json.dumps({**BASE, "bogus": 1})}, "unknown field(s) bogus"),
        ({"definition": json.dumps({"tools": []})}, "provider and model (a pin), or a tier, is required"),
    ],
)
def test_create_form_shows_invalid_input_as_form_errors(
    admin_client: Client, fields: dict[str, Any], error: str
) -> None:
    resp = create(admin_client, "bad", BASE, **fields)
    assert resp.status_code == 200 and error in form_errors(resp)
    assert not AgentDef.objects.filter(name="bad").exists()


def test_create_on_a_static_name_is_refused_and_identical_create_is_deduplicated(admin_client: Client) -> None:
    services.def_sync_static(AGENT, name="static-one", raw=BASE)
    resp = create(admin_client, "static-one", BASE)
    assert resp.status_code == 200 and "use `fork`" in form_errors(resp)

    create(admin_client, "twice", BASE, tenant_id="acme")
    resp = admin_client.post(
        url(AgentDef, "add"),
        {"name": "twice", "tenant_id": "acme", "definition": json.dumps(BASE), "promote": "on"},
        follow=True,
    )
    assert AgentDef.objects.filter(name="twice").count() == 1
    assert AgentDef.objects.get(name="twice").tenant_id == "acme"
    assert any("nothing created" in m for m in texts(resp))


def test_create_without_promote_leaves_the_active_version(admin_client: Client) -> None:
    create(admin_client, "quiet", BASE)
    create(admin_client, "quiet", {**BASE, "system_prompt": "v2"}, promote="")
    assert AgentDef.objects.get(name="quiet", version=1).id == active_id("", "quiet")


def test_tenant_filter_separates_shared_from_tenant_rows(admin_client: Client) -> None:
    create(admin_client, "split", BASE)
    create(admin_client, "split", BASE, tenant_id="acme")
    shared = admin_client.get(AGENT_CHANGELIST, {"tenant": "(shared)", "q": "split"})
    acme = admin_client.get(AGENT_CHANGELIST, {"tenant": "acme", "q": "split"})
    assert [r.tenant_id for r in shared.context["cl"].result_list] == [""]
    assert [r.tenant_id for r in acme.context["cl"].result_list] == ["acme"]


def test_actions_need_the_change_permission(client: Client, django_user_model: Any) -> None:
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_agentdef"))
    client.force_login(viewer)
    page = client.get(AGENT_CHANGELIST)
    assert page.status_code == 200 and "promote_selected" not in page.content.decode()
    assert client.get(url(AgentDef, "add")).status_code == 403


# --- every page renders -------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(KINDS))
def test_pages_of_every_kind_render(admin_client: Client, key: str) -> None:
    kind = KINDS[key]
    parent = kind.model._default_manager.create(id=new_def_id(), name="page", version=1, definition={"a": 1})
    row = kind.model._default_manager.create(
        id=new_def_id(), name="page", version=2, definition={"a": "<b>"}, parent=parent, source=DefSource.YAML
    )
    kind.pointer._default_manager.create(name="page", active_def=row, static_def=row)
    for page in (
        url(kind.model, "changelist"),
        url(kind.model, "change", row.id),
        url(kind.model, "change", parent.id),
        url(kind.model, "add"),
        url(kind.pointer, "changelist"),
        url(kind.pointer, "change", kind.pointer._default_manager.get(name="page").pk),
    ):
        resp = admin_client.get(page)
        assert resp.status_code == 200, page
    assert "&lt;b&gt;" in admin_client.get(url(kind.model, "change", row.id)).content.decode()
    offered = {
        name
        for name, _ in admin_client.get(url(kind.model, "changelist")).context["action_form"].fields["action"].choices
        if name
    }
    expected = {"promote": {"promote_selected"}, "retire": {"retire_selected", "unretire_selected"}}
    assert offered == {"fork_selected"} | set().union(*(v for op, v in expected.items() if op in kind.ops))
    fork_page = admin_client.post(
        url(kind.model, "changelist"), {"action": "fork_selected", "_selected_action": [row.id], "index": "0"}
    )
    assert fork_page.status_code == 200 and fork_page.context["form"].initial["promote"] is kind.fork_promotes


def test_every_versioned_model_and_pointer_has_an_admin() -> None:
    from django.apps import apps
    from django.contrib import admin

    from apps.substrate.models import DefPointer, VersionedDef

    models = [m for m in apps.get_app_config("substrate").get_models() if issubclass(m, VersionedDef | DefPointer)]
    assert len(models) == 2 * len(KINDS) and all(admin.site.is_registered(m) for m in models)


def test_channel_admin_lists_and_keeps_yaml_rows_read_only(admin_client: Client) -> None:
    yaml_row = ChannelDef.objects.create(name="alerts", source=DefSource.YAML)
    runtime = ChannelDef.objects.create(name="scratch", tenant_id="acme")
    listing = admin_client.get(url(ChannelDef, "changelist"), {"q": "a"})
    assert listing.status_code == 200 and "(shared)" in listing.content.decode()
    assert 'name="_save"' not in admin_client.get(url(ChannelDef, "change", yaml_row.pk)).content.decode()
    assert admin_client.post(url(ChannelDef, "change", yaml_row.pk), {"name": "x"}).status_code == 403
    assert admin_client.post(url(ChannelDef, "delete", yaml_row.pk), {"post": "yes"}).status_code == 403
    assert 'name="_save"' in admin_client.get(url(ChannelDef, "change", runtime.pk)).content.decode()


def test_admin_author_is_the_admin_user_in_the_form_tenant(admin_user: Any) -> None:
    from apps.substrate.admin import admin_author

    request = RequestFactory().get("/")
    request.user = admin_user
    assert admin_author(request, "acme") == services.Author(tenant_id="acme", subject="admin:admin", is_admin=True)


# --- operator tokens -------------------------------------------------------------------------

TOKEN_CHANGELIST = reverse("admin:substrate_operatortokendef_changelist")
TOKEN_RE = re.compile(r"lct_[1-9A-HJ-NP-Za-km-z]{20,}")


@pytest.fixture
def token_env(settings: Any, tmp_path: Path) -> Path:
    """No legacy env token (so the last admin token is protected) and a private audit log."""
    audit = tmp_path / "audit.jsonl"
    settings.LOOMCYCLE = dataclasses.replace(settings.LOOMCYCLE, auth_token=None, audit_log_path=str(audit))
    return audit


def mint(client: Client, name: str, tenant: str = "acme", scopes: tuple[str, ...] = ("substrate:admin",)) -> Any:
    data = {"name": name, "tenant_id": tenant, "subject": "", "scopes": list(scopes)}
    return client.post(url(OperatorTokenDef, "add"), data)


def shown_token(resp: Any) -> str:
    html = resp.content.decode()
    found = TOKEN_RE.findall(html)
    assert len(found) == 1, found  # on the page exactly once
    warnings = [m for m in resp.context["messages"] if found[0] in m.message]
    assert [m.level for m in warnings] == [messages.WARNING]
    token: str = found[0]
    return token


def token_action(client: Client, name: str, *ids: str) -> Any:
    return client.post(TOKEN_CHANGELIST, {"action": name, "_selected_action": list(ids), "index": "0"}, follow=True)


def test_mint_shows_the_plaintext_once_and_stores_only_its_hash(admin_client: Client, token_env: Path) -> None:
    form = admin_client.get(url(OperatorTokenDef, "add"))
    assert form.status_code == 200 and form.context["form"].initial["scopes"] == ["substrate:admin"]
    resp = mint(admin_client, "ci", scopes=("runs:create", "runs:read"))
    assert resp.status_code == 200 and resp.templates[0].name == "admin/substrate/token_shown_once.html"
    token = shown_token(resp)
    row = OperatorTokenDef.objects.get(name="ci")
    assert row.token_hash == tokens.token_hash(token) and token not in json.dumps(model_to_dict(row), default=str)
    assert (row.tenant_id, row.subject, row.scopes, row.created_by) == (
        "acme",
        "tok-ci",
        ["runs:create", "runs:read"],
        "admin:admin",
    )
    assert row.token_suffix == token[4:10]
    # never persisted for a later page: not in the message cookie, not in the session
    assert all(token not in morsel.value for morsel in resp.cookies.values())
    assert token not in json.dumps(dict(admin_client.session.items()), default=str)
    for page in (TOKEN_CHANGELIST, url(OperatorTokenDef, "change", row.id)):
        html = admin_client.get(page).content.decode()
        assert token not in html and row.token_hash not in html and "…" + row.token_suffix in html
    assert token not in token_env.read_text() and row.token_hash not in token_env.read_text()
    hit = admin_client.get(TOKEN_CHANGELIST, {"q": row.token_hash})
    assert list(hit.context["cl"].result_list) == []


def test_mint_refusals_are_form_errors(admin_client: Client, token_env: Path) -> None:
    mint(admin_client, "dup")
    resp = mint(admin_client, "dup")
    assert resp.status_code == 200 and "already exists: use rotate" in form_errors(resp)
    resp = mint(admin_client, "bad-tenant", tenant="no spaces")
    assert "tenant_id is required and must match" in form_errors(resp)
    resp = admin_client.post(url(OperatorTokenDef, "add"), {"name": "none", "tenant_id": "acme"})
    assert "scopes" in resp.context["form"].errors
    assert OperatorTokenDef.objects.filter(name__in=["bad-tenant", "none"]).count() == 0
    assert OperatorTokenDef.objects.filter(name="dup").count() == 1


def test_rotate_action_shows_the_new_token_once_and_keeps_the_old_for_the_grace(
    admin_client: Client, token_env: Path
) -> None:
    first = shown_token(mint(admin_client, "deploy"))
    old = OperatorTokenDef.objects.get(name="deploy")
    resp = token_action(admin_client, "rotate_selected", old.id)
    assert resp.templates[0].name == "admin/substrate/token_shown_once.html"
    second = shown_token(resp)
    assert second != first and "previous token stays valid until" in resp.content.decode()
    new = OperatorTokenDef.objects.get(name="deploy", retired_at__isnull=True)
    old.refresh_from_db()
    assert new.rotated_from_id == old.id and new.token_hash == tokens.token_hash(second)
    assert old.retired_at is not None and old.retired_at > new.created_at  # still valid in the grace
    listing = admin_client.get(TOKEN_CHANGELIST, {"state": "rotating"})
    assert [r.id for r in listing.context["cl"].result_list] == [old.id]

    resp = token_action(admin_client, "rotate_selected", old.id)  # a rotating token cannot be rotated again
    assert resp.redirect_chain and any("refused" in m and "already retired or rotating" in m for m in texts(resp))
    assert OperatorTokenDef.objects.filter(name="deploy").count() == 2


def test_revoke_action_retires_now_and_refuses_the_last_admin_token(admin_client: Client, token_env: Path) -> None:
    mint(admin_client, "admin-a")
    mint(admin_client, "admin-b")
    mint(admin_client, "reader", scopes=("runs:read",))
    a, b, reader = (OperatorTokenDef.objects.get(name=n) for n in ("admin-a", "admin-b", "reader"))
    resp = token_action(admin_client, "revoke_selected", a.id, reader.id)
    assert sum("revoked" in m for m in texts(resp)) == 2
    a.refresh_from_db()
    assert a.retired_at is not None and OperatorTokenDef.objects.get(id=reader.id).retired_at is not None

    resp = token_action(admin_client, "revoke_selected", b.id)
    assert any("refused" in m and "last live admin token" in m for m in texts(resp))
    assert OperatorTokenDef.objects.get(id=b.id).retired_at is None
    resp = token_action(admin_client, "revoke_selected", a.id)
    assert any("already retired" in m for m in texts(resp))
    live = admin_client.get(TOKEN_CHANGELIST, {"state": "live"})
    assert [r.name for r in live.context["cl"].result_list] == ["admin-b"]


def test_token_rows_cannot_be_edited_or_deleted(admin_client: Client, token_env: Path) -> None:
    mint(admin_client, "fixed")
    row = OperatorTokenDef.objects.get(name="fixed")
    page = admin_client.get(url(OperatorTokenDef, "change", row.id)).content.decode()
    assert 'name="_save"' not in page and "token_hash" not in page
    assert admin_client.post(url(OperatorTokenDef, "change", row.id), {"name": "x"}).status_code == 403
    assert admin_client.post(url(OperatorTokenDef, "delete", row.id), {"post": "yes"}).status_code == 403
    assert "delete_selected" not in admin_client.get(TOKEN_CHANGELIST).content.decode()
