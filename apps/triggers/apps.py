from django.apps import AppConfig


class TriggersConfig(AppConfig):
    name = "apps.triggers"
    label = "triggers"
    default_auto_field = "django.db.models.BigAutoField"
