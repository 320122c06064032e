"""The console's routes, mounted at /ui/ (loomcycle_project/urls.py). The tenancy probe
(tests/console/test_tenancy.py) is generated from this list: a new route with a path
parameter needs a resolver there."""

from django.urls import path

from apps.console.views import home, runs, signin, stream

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
    # Runs, Playground, Inbox (branch console) above; Library, Spend, Channels & memory,
    # Schedules & webhooks, operator pages (branch console2) below this line.
]
