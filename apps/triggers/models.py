"""The app's tables, one module per capability."""

from apps.triggers.hooks.models import HookFailMode, HookPhase, HookRegistration
from apps.triggers.webhooks.models import Verdict, WebhookDelivery

__all__ = ["HookFailMode", "HookPhase", "HookRegistration", "Verdict", "WebhookDelivery"]
