from __future__ import annotations

from django.apps import AppConfig


class GrpcApiConfig(AppConfig):
    """loomcycle's gRPC API (loomcycle.v1), a transport over the other apps' services: its
    `grpc` management command is the server. Nothing is imported at ready(): the generated
    stubs are needed only by the process that serves."""

    name = "apps.grpcapi"
    label = "grpcapi"
    default_auto_field = "django.db.models.BigAutoField"
