"""Django admin for evaluations: read-only. Rows are immutable (SPEC 9.6):
no add, change or delete from the admin; the database refuses UPDATE as well."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from apps.core.admin import ReadOnlyAdmin
from apps.evaluations.models import Evaluation


@admin.register(Evaluation)
class EvaluationAdmin(ReadOnlyAdmin):
    list_display = ("eval_id", "run_id", "agent_name", "score", "emitter_role", "evaluator_agent_name", "created_at")
    list_filter = ("emitter_role", "tenant_id", "agent_name")
    search_fields = ("eval_id", "run_id", "def_id", "agent_name", "evaluator_run_id")
    ordering = ("-created_at",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [f.name for f in Evaluation._meta.fields]
