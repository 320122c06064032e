from django.contrib import admin
from django.urls import path

from apps.core.health import healthz
from loomcycle_project.api import api

urlpatterns = [
    path("healthz", healthz),
    path("admin/", admin.site.urls),
    path("v1/", api.urls),
]
