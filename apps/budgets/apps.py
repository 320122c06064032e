"""Budgets and usage (issue 37): token and cost limits per tenant, user and
agent, enforced where tokens are spent (apps.core.spend), and the usage API."""

from django.apps import AppConfig


class BudgetsConfig(AppConfig):
    name = "apps.budgets"
    label = "budgets"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.budgets.guard import GUARD
        from apps.core import spend

        spend.install(GUARD)
