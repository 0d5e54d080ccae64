"""The admin reads right for an auditor: times to the second, every list's name spelled right."""

from __future__ import annotations

import re

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from stopdesk.models import Event
from tests.factories import make_item, make_task

pytestmark = pytest.mark.django_db


def test_admin_lists_show_times_to_the_second(roles):
    task = make_task()
    make_item(task)
    client = Client()
    client.force_login(roles["admin"])

    page = client.get(reverse("admin:stopdesk_event_changelist"), {"q": task.pk}).content.decode()

    at = timezone.localtime(Event.objects.filter(task=task).latest("at").at)
    assert at.strftime("%Y-%m-%d %H:%M:%S") in page


def test_every_admin_list_name_is_spelled_right(roles):
    # The rule English applies and Django's default plural ("deliverys") does not.
    misspelled = [
        str(model._meta.verbose_name_plural)
        for model in admin.site._registry
        if re.search(r"[^aeiou]ys$", str(model._meta.verbose_name_plural))
    ]
    client = Client()
    client.force_login(roles["admin"])

    index = client.get(reverse("admin:index")).content.decode()

    assert misspelled == []
    assert "Deliveries" in index and "Deliverys" not in index


def test_the_admin_lists_which_task_each_mcp_gateway_session_files_its_calls_under(roles):
    from stopdesk.services.gateway_sessions import gateway_session_task

    task_id = gateway_session_task(key="k" * 64, title="MCP: claude-code 2.1 via research", actor="gateway:mcp")
    client = Client()
    client.force_login(roles["admin"])

    page = client.get(reverse("admin:stopdesk_gatewaysession_changelist")).content.decode()

    assert f"#{task_id} MCP: claude-code 2.1 via research" in page and "k" * 64 in page
    assert client.get(reverse("admin:stopdesk_gatewaysession_add")).status_code == 403  # read-only
