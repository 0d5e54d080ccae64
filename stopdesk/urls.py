from django.contrib import admin
from django.urls import include, path

from stopdesk.health import healthz, readyz
from stopdesk.metrics import metrics

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("admin/", admin.site.urls),
    path("api/v1/", include("stopdesk.api.urls")),
    path("", include("stopdesk.views.urls")),
]
