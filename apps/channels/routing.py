from django.urls import path

from apps.channels.consumers import ChannelStreamConsumer

# Channel names contain `/`: the `path` converter takes them whole (the trailing slash is required).
websocket_urlpatterns = [path("ws/channels/<path:name>/", ChannelStreamConsumer.as_asgi())]
