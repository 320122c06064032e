from django.apps import AppConfig


class SubstrateConfig(AppConfig):
    name = "apps.substrate"
    label = "substrate"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core import toolregistry
        from apps.substrate.kinds_admin import install_ops
        from apps.substrate.skills import make_skill_tool
        from apps.substrate.tools import AGENT_DEF_TOOL, SKILL_DEF_TOOL

        install_ops()  # kind-specific ops (ScheduleDef add_hook/remove_hook; apps.mcp adds MCPServerDef ones)
        toolregistry.register(AGENT_DEF_TOOL)
        toolregistry.register(SKILL_DEF_TOOL)
        toolregistry.register(make_skill_tool(toolregistry.names))
