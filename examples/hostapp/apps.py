from django.apps import AppConfig


class HostAppConfig(AppConfig):
    name = "examples.hostapp"
    label = "hostapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from examples.hostapp import receivers, tools  # noqa: F401  (registers the tool and the receiver)
