"""The Celery application. Workers scale out on the broker; PostgreSQL stays the source of truth."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "stopdesk.settings")

app = Celery("stopdesk")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
