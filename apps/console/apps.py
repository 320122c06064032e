from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    """The web console at /ui (docs/console.md): server-rendered pages over the apps'
    services and selectors, for any principal that holds a bearer token."""

    name = "apps.console"
    label = "console"
    verbose_name = "Web console"
