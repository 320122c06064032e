"""The app's tables, one module per capability."""

from apps.triggers.webhooks.models import Verdict, WebhookDelivery

__all__ = ["Verdict", "WebhookDelivery"]
