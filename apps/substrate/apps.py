from django.apps import AppConfig


class SubstrateConfig(AppConfig):
    name = "apps.substrate"
    label = "substrate"
    default_auto_field = "django.db.models.BigAutoField"
