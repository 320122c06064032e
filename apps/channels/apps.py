from django.apps import AppConfig


class AgentChannelsConfig(AppConfig):
    """Persistent inter-agent channels. Label `agent_channels`: `channels` is Django Channels'."""

    name = "apps.channels"
    label = "agent_channels"
    verbose_name = "agent channels"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.channels import bridge
        from apps.channels.tools import CHANNEL_TOOL
        from apps.core import toolregistry

        toolregistry.register(CHANNEL_TOOL)
        bridge.connect()
