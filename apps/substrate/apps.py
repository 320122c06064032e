from django.apps import AppConfig


class SubstrateConfig(AppConfig):
    name = "apps.substrate"
    label = "substrate"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.runs import registry
        from apps.substrate.kinds_admin import install_ops
        from apps.substrate.skills import make_skill_tool
        from apps.substrate.tools import AGENT_DEF_TOOL, SKILL_DEF_TOOL

        install_ops()  # kind-specific ops (ScheduleDef add_hook/remove_hook; apps.mcp adds MCPServerDef ones)
        registry.register(AGENT_DEF_TOOL)
        registry.register(SKILL_DEF_TOOL)
        registry.register(make_skill_tool(registry.names))
