"""Admins of the versioned kinds, one per entry of KINDS (and its pointer).

Rows are immutable: the change page is view-only and there is no delete.
Create is the add view, fork an action with an intermediate page; promote,
retire and un-retire are actions. All of them call `services.def_dispatch`
with the admin user as author, so the admin obeys the REST and tool rules.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from apps.core.admin import ReadOnlyAdmin
from apps.core.errors import ApplicationError
from apps.substrate import services
from apps.substrate.admin.common import (
    TenantColumn,
    TenantFilter,
    admin_author,
    change_url,
    clean_tenant,
    form_page,
    json_object,
    pretty_json,
)
from apps.substrate.kinds import KINDS, Kind, Refused
from apps.substrate.models import DefPointer, VersionedDef

_LINEAGE_MAX_HOPS = 100
# action -> the op it runs: a kind without that op (ScheduleDef has no promote) has no such action
_ACTION_OPS = {
    "promote_selected": "promote",
    "retire_selected": "retire",
    "unretire_selected": "retire",
    "fork_selected": "fork",
}
JSON_WIDGET = forms.Textarea(attrs={"rows": 24, "cols": 100, "class": "vLargeTextField", "spellcheck": "false"})
TEXT_WIDGET = forms.Textarea(attrs={"rows": 3, "cols": 100, "class": "vLargeTextField"})


# --- forms ---------------------------------------------------------------------------


class DefForm(forms.Form):
    tenant_id = forms.CharField(max_length=128, required=False, help_text="empty = the shared tenant")
    definition = forms.CharField(widget=JSON_WIDGET, help_text="a JSON object, snake_case fields (SPEC 5.2)")
    description = forms.CharField(
        widget=TEXT_WIDGET, required=False, help_text="why this version exists (not the definition's own description)"
    )
    promote = forms.BooleanField(required=False, help_text="make this version the active one")

    def clean_tenant_id(self) -> str:
        return clean_tenant(self.cleaned_data["tenant_id"])

    def clean_definition(self) -> dict[str, Any]:
        return json_object(self.cleaned_data["definition"])


class DefCreateForm(DefForm):
    name = forms.CharField(max_length=128, help_text="'/'-separated segments of [A-Za-z0-9_-]")
    field_order = ["name", "tenant_id", "definition", "description", "promote"]


class DefForkForm(DefForm):
    def __init__(self, *args: Any, parent: VersionedDef, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parent = parent
        self.fields["tenant_id"].help_text = "the tenant that owns the fork; empty = the shared tenant"

    def clean_definition(self) -> dict[str, Any]:
        definition = super().clean_definition()
        # fork overlays the parent's definition, so a deleted key would silently survive
        removed = sorted(set(self.parent.definition) - set(definition))
        if removed:
            raise forms.ValidationError(
                f"fork overlays the parent's definition, so fields cannot be removed ({', '.join(removed)}); "
                "set them to an empty value instead"
            )
        return definition


# --- versioned kinds -------------------------------------------------------------------


class VersionedDefAdmin(TenantColumn, admin.ModelAdmin):  # type: ignore[type-arg]
    """One per kind (see `register_kind`); `kind` is set on the generated subclass."""

    kind: Kind
    list_display = (
        "name",
        "version",
        "tenant",
        "source",
        "retired",
        "is_active",
        "is_static",
        "short_sha256",
        "parent_link",
        "created_at",
        "created_by",
    )
    list_filter = (TenantFilter, "source", "retired")
    search_fields = ("name", "id", "content_sha256")
    list_select_related = ("parent",)
    actions = ("promote_selected", "retire_selected", "unretire_selected", "fork_selected")
    fieldsets = (
        (None, {"fields": ("id", "name", "version", "tenant", "source", "status", "content_sha256")}),
        ("Lineage", {"fields": ("lineage", "direct_forks", "bootstrapped_from_static")}),
        ("Definition", {"fields": ("definition_json", "description")}),
        ("Provenance", {"fields": ("created_at", "created_by", "created_by_agent_id", "created_by_run_id")}),
    )
    readonly_fields = ("tenant", "status", "lineage", "direct_forks", "definition_json")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        pointers = self.kind.pointer._default_manager
        rows: QuerySet[Any] = (
            super()
            .get_queryset(request)
            .annotate(
                is_active_flag=Exists(pointers.filter(active_def=OuterRef("pk"))),
                is_static_flag=Exists(pointers.filter(static_def=OuterRef("pk"))),
            )
        )
        return rows

    # Rows are immutable: no edit, no delete. Def ops need the model's change permission.
    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_manage_permission(self, request: HttpRequest) -> bool:
        return super().has_change_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return "create" in self.kind.ops and super().has_add_permission(request)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        return {name: a for name, a in actions.items() if _ACTION_OPS.get(name, "") in self.kind.ops}

    # --- columns and fields

    @admin.display(description="active", boolean=True, ordering="is_active_flag")
    def is_active(self, row: Any) -> bool:
        return bool(row.is_active_flag)

    @admin.display(description="static (yaml)", boolean=True, ordering="is_static_flag")
    def is_static(self, row: Any) -> bool:
        return bool(row.is_static_flag)

    @admin.display(description="content sha256", ordering="content_sha256")
    def short_sha256(self, row: VersionedDef) -> str:
        return row.content_sha256.removeprefix("sha256:")[:12] or "-"

    @admin.display(description="parent", ordering="parent__version")
    def parent_link(self, row: VersionedDef) -> SafeString | str:
        parent = row.parent
        if parent is None:
            return "-"
        same = parent.tenant_id == row.tenant_id and parent.name == row.name
        return format_html('<a href="{}">{}</a>', change_url(parent), f"v{parent.version}" if same else str(parent))

    @admin.display(description="status")
    def status(self, row: Any) -> str:
        flags = [
            "active" if row.is_active_flag else "not active",
            "static yaml entry" if row.is_static_flag else "",
            "retired" if row.retired else "",
        ]
        return ", ".join(f for f in flags if f)

    @admin.display(description="parent chain (to the root)")
    def lineage(self, row: VersionedDef) -> SafeString | str:
        chain: list[VersionedDef] = []
        current = row.parent
        while current is not None and len(chain) < _LINEAGE_MAX_HOPS:
            chain.append(current)
            current = current.parent
        if not chain:
            return "root (no parent)"
        return format_html_join(" ← ", '<a href="{}">{}</a>', ((change_url(p), f"{p} ({p.id})") for p in chain))

    @admin.display(description="direct forks")
    def direct_forks(self, row: Any) -> SafeString | str:
        forks = row.forks.order_by("tenant_id", "version")
        if not forks:
            return "none"
        return format_html_join(", ", '<a href="{}">{}</a>', ((change_url(f), f"{f} ({f.id})") for f in forks))

    @admin.display(description="definition")
    def definition_json(self, row: VersionedDef) -> SafeString:
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', pretty_json(row.definition))

    # --- writes, all through the services

    def _dispatch(self, request: HttpRequest, tenant_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Raises Refused (or an ApplicationError) with a message for the operator."""
        return services.def_dispatch(self.kind, admin_author(request, tenant_id), body)

    def _row_op(self, request: HttpRequest, row: VersionedDef, body: dict[str, Any], done: str) -> None:
        try:
            self._dispatch(request, row.tenant_id, body)
        except (Refused, ApplicationError) as exc:
            self.message_user(request, f"{row}: refused: {exc.message}", messages.ERROR)
            return
        self.log_change(request, row, done)
        self.message_user(request, f"{row}: {done}", messages.SUCCESS)

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: Any = None) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            form = DefCreateForm(request.POST)
            if form.is_valid():
                response = self._create(request, form)
                if response is not None:
                    return response
        else:
            form = DefCreateForm(initial={"definition": "{\n}", "promote": True})
        return form_page(self, request, form, title=f"Create {self.kind.tool}", submit="Create")

    def _create(self, request: HttpRequest, form: DefCreateForm) -> HttpResponse | None:
        data = form.cleaned_data
        body = {key: data[key] for key in ("name", "description", "promote")}
        try:
            out = self._dispatch(request, data["tenant_id"], {"op": "create", **body, "overlay": data["definition"]})
        except (Refused, ApplicationError) as exc:
            form.add_error(None, exc.message)
            return None
        row = self.model._default_manager.get(id=out["def_id"])
        if out.get("deduplicated"):
            self.message_user(request, f"{row}: identical to the active version; nothing created", messages.INFO)
        else:
            self.log_addition(request, row, "created through the create op")
            state = "promoted" if out["promoted"] else "not promoted"
            self.message_user(request, f"{row}: created ({state})", messages.SUCCESS)
        return HttpResponseRedirect(change_url(row))

    @admin.action(description="Promote the selected version (one per name)", permissions=["manage"])
    def promote_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        rows = list(queryset)
        per_name = Counter((r.tenant_id, r.name) for r in rows)
        for row in rows:
            if per_name[(row.tenant_id, row.name)] > 1:
                self.message_user(request, f"{row}: not promoted: select one version per name", messages.ERROR)
                continue
            self._row_op(request, row, {"op": "promote", "def_id": row.id}, "promoted (now active)")

    @admin.action(description="Retire the selected versions", permissions=["manage"])
    def retire_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for row in queryset:
            self._row_op(request, row, {"op": "retire", "def_id": row.id, "retired": True}, "retired")

    @admin.action(description="Un-retire the selected versions", permissions=["manage"])
    def unretire_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for row in queryset:
            self._row_op(request, row, {"op": "retire", "def_id": row.id, "retired": False}, "un-retired")

    @admin.action(description="Fork the selected version…", permissions=["manage"])
    def fork_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        rows = list(queryset[:2])
        if len(rows) != 1:
            self.message_user(request, "Fork: select exactly one version to fork from.", messages.WARNING)
            return None
        parent = rows[0]
        if request.POST.get("post"):
            form = DefForkForm(request.POST, parent=parent)
            if form.is_valid():
                response = self._fork(request, parent, form)
                if response is not None:
                    return response
        else:
            initial = {
                "tenant_id": parent.tenant_id,
                "definition": pretty_json(parent.definition),
                "promote": self.kind.fork_promotes,
            }
            form = DefForkForm(initial=initial, parent=parent)
        title = f"Fork {parent}"
        return form_page(self, request, form, title=title, submit="Fork", parent=parent, action="fork_selected")

    def _fork(self, request: HttpRequest, parent: VersionedDef, form: DefForkForm) -> HttpResponse | None:
        data = form.cleaned_data
        body = {
            "op": "fork",
            "name": parent.name,
            "parent_def_id": parent.id,
            "overlay": data["definition"],
            "description": data["description"],
            "promote": data["promote"],
        }
        try:
            out = self._dispatch(request, data["tenant_id"], body)
        except (Refused, ApplicationError) as exc:
            form.add_error(None, exc.message)
            return None
        row = self.model._default_manager.get(id=out["def_id"])
        self.log_addition(request, row, f"forked from {parent.id}")
        state = "promoted" if out["promoted"] else "not promoted"
        self.message_user(request, f"{row}: forked from {parent} ({state})", messages.SUCCESS)
        return HttpResponseRedirect(change_url(row))


class DefPointerAdmin(TenantColumn, ReadOnlyAdmin):
    """Read-only: pointers move only through promote and the yaml loader."""

    list_display = ("name", "tenant", "active_version", "static_version", "promoted_at", "promoted_by")
    list_filter = (TenantFilter,)
    search_fields = ("name", "active_def__id", "static_def__id")
    list_select_related = ("active_def", "static_def")
    ordering = ("tenant_id", "name")

    @staticmethod
    def _link(row: VersionedDef | None) -> SafeString | str:
        if row is None:
            return "-"
        return format_html('<a href="{}">v{}</a>{}', change_url(row), row.version, " (retired)" if row.retired else "")

    @admin.display(description="active version", ordering="active_def__version")
    def active_version(self, pointer: DefPointer) -> SafeString | str:
        return self._link(pointer.active_def)

    @admin.display(description="static (yaml) version", ordering="static_def__version")
    def static_version(self, pointer: DefPointer) -> SafeString | str:
        return self._link(pointer.static_def)


def register_kind(kind: Kind, site: admin.AdminSite = admin.site) -> None:
    """Every kind in KINDS gets a def admin and a pointer admin."""
    if not site.is_registered(kind.model):
        site.register(kind.model, type(f"{kind.tool}Admin", (VersionedDefAdmin,), {"kind": kind}))
    if not site.is_registered(kind.pointer):
        site.register(kind.pointer, type(f"{kind.tool}PointerAdmin", (DefPointerAdmin,), {}))


for _kind in KINDS.values():
    register_kind(_kind)
