from django.apps import AppConfig


class TriggersConfig(AppConfig):
    name = "apps.triggers"
    label = "triggers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.runs import registry
        from apps.triggers.hooks.chain import intercept

        registry.register_interceptor(intercept)  # tool-use hooks around every tool call
