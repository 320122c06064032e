from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "apps.memory"
    label = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.memory.tools import MEMORY_TOOL
        from apps.runs import registry

        registry.register(MEMORY_TOOL)
