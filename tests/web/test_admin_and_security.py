"""Audit in the admin, and the security settings every page carries."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import reverse

from reconcile.models import Compensation, Escalation, ProviderWebhook
from stopdesk.models import CancellationAttempt, Event, ExternalRecord, StopRequest, Task, WorkItem
from tests.factories import make_task
from tests.web.conftest import htmx
from tests.web.scenes import running_task

pytestmark = pytest.mark.django_db


def test_every_ledger_model_is_in_the_admin():
    ledger = (Task, WorkItem, ExternalRecord, StopRequest, CancellationAttempt, Event, Compensation, Escalation)
    for model in (*ledger, ProviderWebhook):
        assert admin.site.is_registered(model), model


def test_admin_changelists_render_for_a_superuser(roles):
    running_task()
    client = Client()
    client.force_login(roles["admin"])
    for name in ("task", "workitem", "externalrecord", "stoprequest", "cancellationattempt", "event"):
        assert client.get(reverse(f"admin:stopdesk_{name}_changelist")).status_code == 200, name
    for name in ("compensation", "escalation", "providerwebhook"):
        assert client.get(reverse(f"admin:reconcile_{name}_changelist")).status_code == 200, name


def test_audit_events_are_read_only_even_for_a_superuser(roles):
    task = running_task()
    event = Event.objects.filter(task=task).first()
    client = Client()
    client.force_login(roles["admin"])
    assert client.get(reverse("admin:stopdesk_event_add")).status_code == 403
    assert client.get(reverse("admin:stopdesk_event_delete", args=[event.pk])).status_code == 403
    # The change page is a read-only view: a POST changes nothing.
    client.post(reverse("admin:stopdesk_event_change", args=[event.pk]), {"kind": "forged", "actor": "admin"})
    event.refresh_from_db()
    assert event.kind != "forged"
    changelist = client.get(reverse("admin:stopdesk_event_changelist")).content.decode()
    assert "Delete selected" not in changelist and "action-select" not in changelist


def test_per_task_timeline_in_the_admin(roles):
    task = running_task()
    client = Client()
    client.force_login(roles["admin"])
    page = client.get(reverse("admin:stopdesk_task_timeline", args=[task.pk])).content.decode()
    assert "task_created" in page and "item_registered" in page and f"Timeline of task #{task.pk}" in page


def test_every_page_carries_a_content_security_policy(as_user):
    response = as_user("operator").get(reverse("task-list"))
    policy = response["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy


def test_pages_load_htmx_from_static_not_a_cdn(as_user):
    html = as_user("operator").get(reverse("task-list")).content.decode()
    assert "/static/vendor/htmx-2.0.11/htmx.min.js" in html
    assert "unpkg" not in html and "cdn" not in html.lower()


def test_csrf_is_enforced_on_htmx_posts(roles):
    task = running_task()
    client = Client(enforce_csrf_checks=True)
    client.force_login(roles["operator"])
    refused = client.post(reverse("task-stop", args=[task.pk]), **htmx("stop-action"))
    assert refused.status_code == 403
    assert not StopRequest.objects.filter(task=task).exists()
    page = client.get(reverse("task-detail", args=[task.pk])).content.decode()
    # The token is set once on <body> for every htmx request.
    assert 'hx-headers=\'{"X-CSRFToken": "' in page
    token = client.cookies["csrftoken"].value
    allowed = client.post(reverse("task-stop", args=[task.pk]), HTTP_X_CSRFTOKEN=token, **htmx("stop-action"))
    assert allowed.status_code == 200


def test_user_and_external_content_is_escaped(as_user):
    from stopdesk.services.items import item_attach_record, item_register

    task = make_task('<script>alert("t")</script>')
    item = item_register(
        task=task, kind="external_operation", noun="record", actor="t", label="<img src=x onerror=alert(1)>"
    )
    item_attach_record(
        item_id=item.pk, system="crm", record_id="<b>r<b>", effect="created", actor="t", link="javascript:alert(1)"
    )
    client = as_user("operator")
    for url in (reverse("task-list"), reverse("task-detail", args=[task.pk])):
        html = client.get(url).content.decode()
        assert '<script>alert("t")</script>' not in html and "&lt;script&gt;" in html
        assert "<img src=x" not in html and "<b>r<b>" not in html
        assert 'href="javascript:' not in html


def test_production_mode_sets_secure_cookies_and_headers():
    code = (
        "import django, os; os.environ['DJANGO_SETTINGS_MODULE']='stopdesk.settings'; django.setup();"
        "from django.conf import settings as s;"
        "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS > 0, s.DEBUG)"
    )
    env = {
        **os.environ,
        "STOPDESK_ENV": "production",
        "SECRET_KEY": "test-only-0123456789-abcdefghijklmnopqrstuvwxyz-ABCDEFGH",
        "DATABASE_URL": "sqlite:////tmp/x.db",
        "STOPDESK_TESTING": "0",
        "ALLOWED_HOSTS": "stopdesk.example.test",
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=os.getcwd()
    )
    assert out.stdout.split() == ["True", "True", "True", "True", "False"]


def test_roles_are_created_by_the_migration_data():
    # The session-scoped test database was migrated: the groups exist with their permissions.
    operators = Group.objects.get(name="operators")
    assert operators.permissions.filter(codename="stop_task").exists()
    assert Group.objects.get(name="approvers").permissions.filter(codename="approve_compensation").exists()
    assert not Group.objects.get(name="reviewers").permissions.filter(codename="approve_compensation").exists()


def test_create_demo_users_puts_people_in_their_groups(django_user_model, settings):
    from django.core.management import call_command

    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    call_command("create_demo_users", stdout=io.StringIO())
    assert django_user_model.objects.get(username="operator").has_perm("stopdesk.stop_task")
    assert django_user_model.objects.get(username="approver2").has_perm("reconcile.approve_compensation")
    assert not django_user_model.objects.get(username="reviewer").has_perm("reconcile.approve_compensation")
