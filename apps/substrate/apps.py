from django.apps import AppConfig


class SubstrateConfig(AppConfig):
    name = "apps.substrate"
    label = "substrate"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core import toolregistry
        from apps.substrate import services
        from apps.substrate.hookops import SCHEDULE_OPS
        from apps.substrate.skills import make_skill_tool
        from apps.substrate.tools import AGENT_DEF_TOOL, SKILL_DEF_TOOL

        services.def_ops_register("schedule", SCHEDULE_OPS)  # add_hook, remove_hook (apps.mcp adds MCPServerDef's)
        toolregistry.register(AGENT_DEF_TOOL)
        toolregistry.register(SKILL_DEF_TOOL)
        toolregistry.register(make_skill_tool(toolregistry.names))
