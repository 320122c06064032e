from django.urls import path

from apps.runs.consumers import RunStreamConsumer

websocket_urlpatterns = [path("ws/runs/<str:run_id>/", RunStreamConsumer.as_asgi())]
