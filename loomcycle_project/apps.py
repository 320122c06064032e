"""What spans the apps is an app too (the last of the runtime's): its ready() connects the
project's own handlers to Celery's process signals, so workers/ stays plumbing."""

from django.apps import AppConfig


class ProjectConfig(AppConfig):
    name = "loomcycle_project"
    label = "loomcycle_project"
    verbose_name = "loomcycle"

    def ready(self) -> None:
        from loomcycle_project import telemetry

        telemetry.connect_celery()  # tracing in each worker process and beat
