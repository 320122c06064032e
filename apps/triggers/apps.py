"""Triggers: schedules fired by beat, inbound webhooks and tool-use hooks.

ScheduleDef and WebhookDef themselves stay in apps/substrate; this app owns
what happens when they fire (fire rows, deliveries, hook registrations).
"""

from django.apps import AppConfig


class TriggersConfig(AppConfig):
    name = "apps.triggers"
    label = "triggers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core import toolregistry
        from apps.runs import registry
        from apps.substrate.signals import version_activated
        from apps.triggers.erasure import trigger_rows_of_runs_delete
        from apps.triggers.hooks.chain import intercept
        from apps.triggers.services import schedule_activated, trigger_run_finished

        toolregistry.register_interceptor(intercept)  # tool-use hooks around every tool call

        # A trigger's run (created with notify_finished) ends: its on_complete hooks, its fire's record.
        registry.on_run_finished(trigger_run_finished)
        # A run tree is deleted (DELETE /v1/runs/{id}, retention, erasure): its deliveries and jobs go too.
        registry.on_runs_deleted(trigger_rows_of_runs_delete)

        # A ScheduleDef version became active (promote, un-retire): its state is re-seeded.
        version_activated.connect(schedule_activated, dispatch_uid="triggers.schedule_activated")
