from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core.admission import ADMISSION
        from apps.gateway import waits
        from apps.runs import (
            fanout,
            interrupts_admin,  # noqa: F401  (registers the pending-interrupts admin)
            lifecycle,
            registry,
            resident,
            sessions,
            subruns,
        )
        from apps.runs.interruption import INTERRUPTION_TOOL
        from apps.runs.subruns import AGENT_TOOL
        from apps.runs.tools import CONTEXT_TOOL

        registry.register(CONTEXT_TOOL)
        registry.register(AGENT_TOOL)
        registry.register(INTERRUPTION_TOOL)
        # A run's end (apps.runs.lifecycle): the wings' after-effects, in this order.
        lifecycle.subscribe(resident.on_run_ended, when=lifecycle.may_hold_residents)
        lifecycle.subscribe(subruns.on_run_ended, when=lifecycle.is_child)
        lifecycle.subscribe(sessions.on_run_ended, when=lifecycle.is_top_level)
        lifecycle.on_run_finished(fanout.on_run_finished)  # runs:batch children report to their join
        # The gateway's waits (mock latency, provider-slot waits) give up the engine's admission slot.
        waits.install(ADMISSION.outside)
