"""The console's routes, mounted at /ui/ (loomcycle_project/urls.py). The tenancy probe
(tests/console/test_tenancy.py) is generated from this list: a new route with a path
parameter needs a resolver there."""

from django.urls import path

from apps.console.views import channels, home, library, memory, ops, runs, schedules, signin, spend

app_name = "console"

urlpatterns = [
    path("", home.home, name="home"),
    path("signin", signin.signin, name="signin"),
    path("signout", signin.signout, name="signout"),
    path("runs/", runs.runs_list, name="runs"),
    # Runs, Playground, Inbox (branch console) above; Library, Spend, Channels & memory,
    # Schedules & webhooks, operator pages (branch console2) below this line.
    path("library/", library.library, name="library"),
    path("library/<str:kind>/", library.library_kind, name="library_kind"),
    path("library/<str:kind>/<path:name>/", library.library_def, name="library_def"),
    path("spend/", spend.spend, name="spend"),
    path("channels/", channels.channels, name="channels"),
    path("channels/<path:name>/", channels.channel, name="channel"),
    path("memory/", memory.memory, name="memory"),
    path("memory/search", memory.memory_search, name="memory_search"),
    path("schedules/", schedules.schedules, name="schedules"),
    path("schedules/<str:def_id>/", schedules.schedule, name="schedule"),
    path("webhooks/", schedules.webhooks_list, name="webhooks"),
    path("webhooks/<path:name>/", schedules.webhook_deliveries, name="webhook_deliveries"),
    path("ops/runtime/", ops.runtime_page, name="ops_runtime"),
    path("ops/snapshots/", ops.snapshots_page, name="ops_snapshots"),
    path("ops/replicas/", ops.replicas_page, name="ops_replicas"),
]
