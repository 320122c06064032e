"""Operator tokens: minted, rotated and revoked only through `apps.substrate.tokens`.

`token_hash` is never shown (not a field, column or search key). The
plaintext of a mint or rotation is a warning message rendered in the
response to that very POST, so it is never stored in the message cookie or
the session, and it cannot be shown again.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.substrate import tokens
from apps.substrate.admin.common import TenantColumn, TenantFilter, admin_subject, form_page
from apps.substrate.kinds import Refused
from apps.substrate.models import OperatorTokenDef


class TokenCreateForm(forms.Form):
    name = forms.CharField(max_length=64, help_text="[a-zA-Z0-9_-]{1,64}; one live token per name (rotate to replace)")
    tenant_id = forms.CharField(max_length=64, help_text="the tenant this token acts for")
    subject = forms.CharField(max_length=128, required=False, help_text="empty = tok-<name>")
    scopes = forms.MultipleChoiceField(
        choices=[(s, s) for s in sorted(tokens.SCOPE_CATALOG)],
        widget=forms.CheckboxSelectMultiple,
        help_text="substrate:admin implies every scope and every tenant",
    )


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("live", "live"), ("rotating", "rotating (grace)"), ("retired", "retired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        now = timezone.now()
        conditions = {
            "live": Q(retired_at__isnull=True),
            "rotating": Q(retired_at__gt=now),
            "retired": Q(retired_at__lte=now),
        }
        value = self.value()
        return queryset.filter(conditions[value]) if value in conditions else queryset


@admin.register(OperatorTokenDef)
class OperatorTokenDefAdmin(TenantColumn, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = (
        "name",
        "tenant",
        "subject",
        "scope_list",
        "suffix",
        "created_at",
        "retired_at",
        "is_live",
        "state",
    )
    list_filter = (TenantFilter, StateFilter)
    search_fields = ("name", "subject", "tenant_id", "=token_suffix", "=id")
    fields = (
        "id",
        "name",
        "tenant_id",
        "subject",
        "scopes",
        "token_suffix",
        "imported",
        "rotated_from",
        "created_at",
        "created_by",
        "retired_at",
    )  # never token_hash
    actions = ("rotate_selected", "revoke_selected")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # revoke instead: the row stays for the audit trail

    def has_manage_permission(self, request: HttpRequest) -> bool:
        return super().has_change_permission(request)

    @admin.display(description="scopes")
    def scope_list(self, row: OperatorTokenDef) -> str:
        return ", ".join(row.scopes)

    @admin.display(description="suffix", ordering="token_suffix")
    def suffix(self, row: OperatorTokenDef) -> str:
        return f"…{row.token_suffix}"

    @admin.display(description="live", boolean=True)
    def is_live(self, row: OperatorTokenDef) -> bool:
        """Authenticates right now (live, or inside a rotation grace)."""
        return row.retired_at is None or row.retired_at > timezone.now()

    @admin.display(description="state")
    def state(self, row: OperatorTokenDef) -> str:
        return str(tokens.token_out(row)["state"])

    def add_view(self, request: HttpRequest, form_url: str = "", extra_context: Any = None) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        if request.method != "POST":
            form = TokenCreateForm(initial={"scopes": [tokens.ADMIN_SCOPE]})
            return form_page(self, request, form, title="Mint an operator token", submit="Mint")
        form = TokenCreateForm(request.POST)
        if form.is_valid():
            try:
                out = tokens.token_create(**form.cleaned_data, by=admin_subject(request))
            except (Refused, ApplicationError) as exc:
                form.add_error(None, exc.message)
            else:
                row = OperatorTokenDef.objects.get(id=out["def_id"])
                self.log_addition(request, row, "minted")
                return self._shown_once(request, [(row, out["token"], "")])
        return form_page(self, request, form, title="Mint an operator token", submit="Mint")

    def _shown_once(self, request: HttpRequest, minted: list[tuple[OperatorTokenDef, str, str]]) -> HttpResponse:
        """Render (not redirect): the messages are consumed by this response and never stored."""
        for row, token, prior in minted:
            note = f" The previous token stays valid until {prior}." if prior else ""
            # the token last, so no punctuation sticks to it when copied
            text = f"New token {row.name!r} (tenant {row.tenant_id}): {tokens.SHOWN_ONCE}.{note} Token: {token}"
            messages.warning(request, text)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Token shown once",
            "minted": [row for row, _, _ in minted],
        }
        return TemplateResponse(request, "admin/substrate/token_shown_once.html", context)

    @admin.action(description="Rotate the selected tokens (new token shown once)", permissions=["manage"])
    def rotate_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> HttpResponse | None:
        minted = []
        for row in queryset:
            try:
                out = tokens.token_rotate(def_id=row.id, by=admin_subject(request))
            except (Refused, ApplicationError) as exc:
                self.message_user(request, f"{row}: refused: {exc.message}", messages.ERROR)
                continue
            new = OperatorTokenDef.objects.get(id=out["def_id"])
            self.log_addition(request, new, f"rotated from {row.id}")
            minted.append((new, out["token"], out["prior_retires_at"]))
        return self._shown_once(request, minted) if minted else None

    @admin.action(description="Revoke the selected tokens now", permissions=["manage"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for row in queryset:
            try:
                out = tokens.token_retire(def_id=row.id, by=admin_subject(request))
            except (Refused, ApplicationError) as exc:
                self.message_user(request, f"{row}: refused: {exc.message}", messages.ERROR)
                continue
            if out["already_retired"]:
                self.message_user(request, f"{row}: already retired", messages.INFO)
            else:
                self.log_change(request, row, "revoked")
                self.message_user(request, f"{row}: revoked", messages.SUCCESS)
