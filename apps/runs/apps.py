from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core import toolregistry
        from apps.gateway import waits
        from apps.runs import lifecycle
        from apps.runs.children import fanout, report, resident
        from apps.runs.children.tool import AGENT_TOOL
        from apps.runs.engine.admission import ADMISSION
        from apps.runs.interrupts import admin as interrupts_admin  # noqa: F401  (registers the pending-interrupts admin)
        from apps.runs.interrupts.tool import INTERRUPTION_TOOL
        from apps.runs.sessions import promotion
        from apps.runs.sessions.history import HISTORY_TOOL
        from apps.runs.tools import CONTEXT_TOOL

        toolregistry.register(CONTEXT_TOOL)
        toolregistry.register(AGENT_TOOL)
        toolregistry.register(INTERRUPTION_TOOL)
        toolregistry.register(HISTORY_TOOL)
        # A run's end (apps.runs.lifecycle): the wings' after-effects, in this order.
        lifecycle.subscribe(resident.on_run_ended, when=lifecycle.may_hold_residents)
        lifecycle.subscribe(report.on_run_ended, when=lifecycle.is_child)
        lifecycle.subscribe(promotion.on_run_ended, when=lifecycle.is_top_level)
        lifecycle.on_run_finished(fanout.on_run_finished)  # runs:batch children report to their join
        # The gateway's waits (mock latency, provider-slot waits) give up the engine's admission slot.
        waits.install(ADMISSION.outside)
