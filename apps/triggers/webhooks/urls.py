"""The receiver's routes; loomcycle_project/urls.py mounts them when LOOMCYCLE_WEBHOOKS_ENABLED=1."""

from django.urls import URLPattern, path

from apps.triggers.webhooks.views import webhook_receive_view

webhook_urlpatterns: list[URLPattern] = [
    path("v1/_webhooks/<str:name>", webhook_receive_view),
    path("v1/_webhooks/<str:tenant>/<str:name>", webhook_receive_view),
]
