"""The console's routes, mounted at /ui/ (loomcycle_project/urls.py). The tenancy probe
(tests/console/test_tenancy.py) is generated from this list: a new route with a path
parameter needs a resolver there."""

from django.urls import path
from django.views.decorators.http import require_POST

from apps.console.views import (
    channels,
    home,
    inbox,
    library,
    memory,
    ops,
    playground,
    runs,
    schedules,
    signin,
    spend,
    stream,
)

app_name = "console"

urlpatterns = [
    path("", home.home, name="home"),
    path("signin", signin.signin, name="signin"),
    path("signout", signin.signout, name="signout"),
    path("runs/", runs.runs_list, name="runs"),
    path("runs/compare", runs.runs_compare, name="runs-compare"),
    path("runs/<str:run_id>/", runs.run_page, name="run"),
    path("runs/<str:run_id>/stream", stream.run_stream, name="run-stream"),
    path("runs/<str:run_id>/cancel", runs.run_cancel_view, name="run-cancel"),
    path("runs/<str:run_id>/fork", runs.run_fork_view, name="run-fork"),
    path("playground/", playground.playground, name="playground"),
    path("playground/start", require_POST(playground.playground_start), name="playground-start"),
    path("playground/adhoc", require_POST(playground.playground_adhoc), name="playground-adhoc"),
    path("playground/<str:run_id>/", playground.chat, name="chat"),
    path("playground/<str:run_id>/input", require_POST(playground.chat_input), name="chat-input"),
    path("playground/<str:run_id>/turn-cancel", require_POST(playground.chat_turn_cancel), name="chat-turn-cancel"),
    path("playground/<str:run_id>/usage", playground.chat_usage, name="chat-usage"),
    path("inbox/", inbox.inbox, name="inbox"),
    path("inbox/<str:run_id>/<str:interrupt_id>/resolve", require_POST(inbox.resolve), name="inbox-resolve"),
    path("sessions/<str:session_id>/send", require_POST(playground.session_send), name="session-send"),
    # Runs, Playground, Inbox (branch console) above; Library, Spend, Channels & memory,
    # Schedules & webhooks, operator pages (branch console2) below this line.
    path("library/", library.library, name="library"),
    path("library/<str:kind>/", library.library_kind, name="library-kind"),
    path("library/<str:kind>/<path:name>/", library.library_def, name="library-def"),
    path("spend/", spend.spend, name="spend"),
    path("channels/", channels.channels, name="channels"),
    path("channels/<path:name>/", channels.channel, name="channel"),
    path("memory/", memory.memory, name="memory"),
    path("memory/search", memory.memory_search, name="memory-search"),
    path("schedules/", schedules.schedules, name="schedules"),
    path("schedules/<str:def_id>/", schedules.schedule, name="schedule"),
    path("webhooks/", schedules.webhooks_list, name="webhooks"),
    path("webhooks/<path:name>/", schedules.webhook_deliveries, name="webhook-deliveries"),
    path("ops/runtime/", ops.runtime_page, name="ops-runtime"),
    path("ops/snapshots/", ops.snapshots_page, name="ops-snapshots"),
    path("ops/replicas/", ops.replicas_page, name="ops-replicas"),
]
