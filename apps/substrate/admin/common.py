"""Helpers shared by the substrate admins."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from apps.core.ids import IDENT_RE
from apps.substrate import services

SHARED = "(shared)"  # list-filter value and label of the shared tenant ""


def admin_author(request: HttpRequest, tenant_id: str) -> services.Author:
    """The admin user as a def author: the operator plane, in the form's tenant."""
    return services.Author(tenant_id=tenant_id, subject=admin_subject(request), is_admin=True)


def admin_subject(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


def change_url(obj: Any) -> str:
    opts = obj._meta
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(obj.pk)])


def tenant_label(tenant_id: str) -> str:
    return tenant_id or SHARED


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as exc:
        raise forms.ValidationError(f"not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise forms.ValidationError("must be a JSON object ({...})")
    return value


def clean_tenant(value: str) -> str:
    value = value.strip()
    if value and not IDENT_RE.fullmatch(value):
        raise forms.ValidationError("tenant id must match [A-Za-z0-9_-]{1,128} (empty = shared tenant)")
    return value


def form_page(model_admin: Any, request: HttpRequest, form: forms.Form, **context: Any) -> TemplateResponse:
    """An admin-styled page with one form (create, fork, mint)."""
    return TemplateResponse(
        request,
        "admin/substrate/def_form.html",
        {
            **model_admin.admin_site.each_context(request),
            "opts": model_admin.model._meta,
            "form": form,
            **context,
        },
    )


class TenantFilter(admin.SimpleListFilter):
    title = "tenant"
    parameter_name = "tenant"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        tenants = model_admin.model._default_manager.order_by().values_list("tenant_id", flat=True).distinct()
        return [(tenant_label(t), tenant_label(t)) for t in sorted(tenants)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        return queryset.filter(tenant_id="" if value == SHARED else value)


class TenantColumn:
    """Mixin: a `tenant` column showing "(shared)" for ""."""

    @admin.display(description="tenant", ordering="tenant_id")
    def tenant(self, obj: Any) -> str:
        return tenant_label(obj.tenant_id)
