"""Built-in world tools (network, files, shell) and the trust model around them.

They register with the tool registry (apps.core.toolregistry) at `AppConfig.ready()`, like every
other app's tools, so the engine never imports them.
"""

from django.apps import AppConfig


class ToolsConfig(AppConfig):
    name = "apps.tools"
    label = "tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from apps.core import toolregistry
        from apps.runs import registry
        from apps.tools.bash import BASH_TOOL
        from apps.tools.files import EDIT_TOOL, GLOB_TOOL, READ_TOOL, WRITE_TOOL
        from apps.tools.grep import GREP_TOOL
        from apps.tools.network import HTTP_TOOL, WEBFETCH_TOOL
        from apps.tools.posture import network_stances, stance_register
        from apps.tools.volumes import bindings_resolve, ephemeral_volumes_finished, file_stances
        from apps.tools.websearch import WEBSEARCH_TOOL

        toolregistry.register(HTTP_TOOL)
        toolregistry.register(WEBFETCH_TOOL)
        toolregistry.register(WEBSEARCH_TOOL)
        stance_register(network_stances)
        stance_register(file_stances)
        for tool in (READ_TOOL, WRITE_TOOL, EDIT_TOOL, GLOB_TOOL, GREP_TOOL, BASH_TOOL):
            toolregistry.register(tool)
        toolregistry.set_volume_resolver(bindings_resolve)
        registry.on_run_finished(ephemeral_volumes_finished)
