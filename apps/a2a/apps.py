from django.apps import AppConfig


class A2AConfig(AppConfig):
    name = "apps.a2a"
    label = "a2a"
    verbose_name = "A2A"

    def ready(self) -> None:
        from apps.a2a import calls, push, tools
        from apps.core import toolregistry
        from apps.runs import lifecycle

        toolregistry.register_provider(tools.a2a_tools, prefix=tools.PREFIX)
        lifecycle.subscribe(calls.on_run_ended, when=calls.had_a2a_tool)
        lifecycle.subscribe(push.on_run_ended, when=lifecycle.is_top_level)
