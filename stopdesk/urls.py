from django.contrib import admin
from django.urls import include, path

from stopdesk.health import healthz

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("stopdesk.api.urls")),
    path("", include("stopdesk.views.urls")),
]
