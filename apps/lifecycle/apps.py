"""Data lifecycle: retention of ended runs, no-trace runs, a person's erasure (docs/operations.md,
"Data lifecycle"). It spans the apps whose rows it removes and calls each one's service, never
their SQL: apps.runs (run trees), apps.memory, apps.channels, apps.gateway (the ledger)."""

from django.apps import AppConfig


class LifecycleConfig(AppConfig):
    name = "apps.lifecycle"
    label = "lifecycle"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.evaluations.erasure import evaluations_of_runs_delete
        from apps.lifecycle import notrace
        from apps.runs import registry

        # A top-level no-trace run ends (created with notify_finished): its tree is deleted.
        registry.on_run_finished(notrace.on_run_finished)
        # apps.evaluations' AppConfig offers tools only and never imports apps.runs: its rows about
        # deleted runs are registered from here.
        registry.on_runs_deleted(evaluations_of_runs_delete)
