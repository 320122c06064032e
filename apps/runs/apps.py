from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core import toolregistry
        from apps.core.admission import ADMISSION
        from apps.gateway import waits
        from apps.runs import (
            fanout,
            interrupts_admin,  # noqa: F401  (registers the pending-interrupts admin)
            registry,
        )
        from apps.runs.interruption import INTERRUPTION_TOOL
        from apps.runs.subruns import AGENT_TOOL
        from apps.runs.tools import CONTEXT_TOOL

        toolregistry.register(CONTEXT_TOOL)
        toolregistry.register(AGENT_TOOL)
        toolregistry.register(INTERRUPTION_TOOL)
        registry.on_run_finished(fanout.on_run_finished)  # runs:batch children report to their join
        # The gateway's waits (mock latency, provider-slot waits) give up the engine's admission slot.
        waits.install(ADMISSION.outside)
