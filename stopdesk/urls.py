from django.contrib import admin
from django.urls import include, path

from reconcile.views_webhooks import openai_webhook
from stopdesk.health import healthz, readyz
from stopdesk.metrics import metrics
from stopdesk.notify import views as notify_views

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("metrics", metrics, name="metrics"),
    path("notifications/", notify_views.deliveries_page, name="notify-deliveries"),
    path("notifications/email/", notify_views.email_choices, name="notify-email"),
    path("admin/", admin.site.urls),
    path("hooks/openai", openai_webhook, name="hooks-openai"),
    path("api/v1/", include("stopdesk.api.urls")),
    path("", include("stopdesk.sso.urls")),
    path("", include("stopdesk.views.urls")),
]
