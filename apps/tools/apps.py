from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "apps.tools"
    label = "tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.runs import registry
        from apps.tools.network import HTTP_TOOL, WEBFETCH_TOOL
        from apps.tools.posture import network_stances, stance_register

        registry.register(HTTP_TOOL)
        registry.register(WEBFETCH_TOOL)
        stance_register(network_stances)
