from django.apps import AppConfig


class MemoryConfig(AppConfig):
    name = "apps.memory"
    label = "memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core import toolregistry
        from apps.memory.tools import MEMORY_TOOL

        toolregistry.register(MEMORY_TOOL)
