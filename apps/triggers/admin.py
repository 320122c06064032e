"""The app's admin pages, one module per capability."""

from apps.triggers.webhooks import admin as webhooks_admin

__all__ = ["webhooks_admin"]
