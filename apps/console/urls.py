"""The console's routes, mounted at /ui/ (loomcycle_project/urls.py). The tenancy probe
(tests/console/test_tenancy.py) is generated from this list: a new route with a path
parameter needs a resolver there."""

from django.urls import path

from apps.console.views import home, runs, signin

app_name = "console"

urlpatterns = [
    path("", home.home, name="home"),
    path("signin", signin.signin, name="signin"),
    path("signout", signin.signout, name="signout"),
    path("runs/", runs.runs_list, name="runs"),
    # Runs, Playground, Inbox (branch console) above; Library, Spend, Channels & memory,
    # Schedules & webhooks, operator pages (branch console2) below this line.
]
