"""An auditor takes the ledger away: CSV and JSON Lines exports of the admin's filtered lists,
streamed, audited, and only for staff who may see the list; a date range on each list."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
from urllib.parse import urljoin

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from reconcile.services.records import records_accept_as_is
from reconcile.services.review import item_escalate
from stopdesk.admin_export import ExportMixin
from stopdesk.models import Event, StopRequest
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState
from tests.factories import ACTOR, make_external_effect, make_item, make_task
from tests.web.scenes import proposal, uncertain_item

pytestmark = pytest.mark.django_db


def admin_client(roles) -> Client:  # type: ignore[no-untyped-def]
    client = Client()
    client.force_login(roles["admin"])
    return client


def body(response) -> str:  # type: ignore[no-untyped-def]
    return b"".join(response.streaming_content).decode()


def csv_rows(response) -> list[dict[str, str]]:  # type: ignore[no-untyped-def]
    return list(csv.DictReader(io.StringIO(body(response))))


def link_named(page: str, text: str, base: str = "") -> str:
    """The address a person reaches by clicking the link `text` on `page` (found at `base`)."""
    match = re.search(rf'<a href="([^"]*)"[^>]*>\s*{re.escape(text)}\s*</a>', page)
    assert match, f"no link {text!r} on the page"
    return urljoin(base, match.group(1).replace("&amp;", "&"))


def stop(task, reason: str = "") -> StopRequest:  # type: ignore[no-untyped-def]
    task_request_stop(task_id=task.pk, actor=ACTOR, reason=reason, dispatch=lambda ids: None)
    return StopRequest.objects.get(task=task)


def test_the_event_export_holds_every_filtered_row_not_only_the_page(roles):
    task = make_task("Refund the March orders")
    for _ in range(60):
        make_item(task, noun="refund")
    other = make_task("Something else")
    make_item(other)
    client = admin_client(roles)

    page = client.get(reverse("admin:stopdesk_event_changelist"), {"kind": "item_registered", "q": task.pk})
    rows = csv_rows(client.get(link_named(page.content.decode(), "Export CSV")))

    assert len(rows) == 60 > 50  # the list shows 50 a page; the export has them all
    assert {r["kind"] for r in rows} == {"item_registered"}
    assert {r["task_id"] for r in rows} == {str(task.pk)}
    assert list(rows[0]) == [
        "id", "at", "task_id", "item_id", "kind", "actor", "from_state", "to_state", "message", "data", "seq", "hash"
    ]  # fmt: skip


def test_items_export_as_json_lines_with_times_to_the_second(roles):
    task = make_task()
    item = make_item(task, state=ItemState.FAILED, noun="upload", handle="h-1", idempotency_key="k-1")
    client = admin_client(roles)

    response = client.get(reverse("admin:stopdesk_workitem_export", args=["jsonl"]), {"state": "failed"})

    assert response["Content-Type"].startswith("application/jsonl")
    assert "attachment" in response["Content-Disposition"]
    lines = body(response).splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert (row["id"], row["state"], row["outcome"], row["idempotency_key"]) == (item.pk, "failed", "boom", "k-1")
    assert dt.datetime.fromisoformat(row["finished_at"]) == item.finished_at
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", row["created_at"])


def test_compensations_export_with_who_proposed_them(roles):
    task = make_task("Onboard customers")
    record = make_external_effect(task).external_records.get()
    stop(task)
    compensation = proposal(record, roles["reviewer"])
    client = admin_client(roles)

    rows = csv_rows(client.get(reverse("admin:reconcile_compensation_export", args=["csv"]), {"state": "proposed"}))

    assert [(r["id"], r["action"], r["proposed_by"], r["record_id"]) for r in rows] == [
        (str(compensation.pk), "archive", "reviewer", record.record_id)
    ]


def test_stops_yesterday_is_one_click_and_the_export_honours_it(roles):
    yesterdays, todays = make_task("Yesterday's run"), make_task("Today's run")
    moved = stop(yesterdays)
    stop(todays)
    # Set-up, not history: the stop request row is not an audit event.
    StopRequest.objects.filter(pk=moved.pk).update(requested_at=timezone.now() - dt.timedelta(days=1))
    client = admin_client(roles)

    stops = reverse("admin:stopdesk_stoprequest_changelist")
    filtered = client.get(link_named(client.get(stops).content.decode(), "Yesterday", stops)).content.decode()
    rows = csv_rows(client.get(link_named(filtered, "Export CSV")))

    assert "Yesterday&#x27;s run" in filtered and "Today&#x27;s run" not in filtered
    assert [r["task_title"] for r in rows] == ["Yesterday's run"]


def test_a_typed_date_range_includes_its_last_day(roles):
    task = make_task()
    make_item(task)
    today = timezone.localdate()
    yesterday = today - dt.timedelta(days=1)
    client = admin_client(roles)
    export = reverse("admin:stopdesk_event_export", args=["csv"])

    through_today = csv_rows(client.get(export, {"q": task.pk, "at__gte": yesterday, "at__lte": today}))
    through_yesterday = csv_rows(client.get(export, {"q": task.pk, "at__gte": yesterday, "at__lte": yesterday}))

    assert len(through_today) == Event.objects.filter(task=task).count() > 0
    assert through_yesterday == []
    page = client.get(reverse("admin:stopdesk_event_changelist"), {"at__gte": today.isoformat()}).content.decode()
    assert f'value="{today.isoformat()}"' in page  # the form shows the range it applied


def test_a_date_that_is_not_one_is_refused_and_nothing_is_exported(roles):
    client = admin_client(roles)

    response = client.get(reverse("admin:stopdesk_event_export", args=["csv"]), {"at__gte": "last tuesday"})

    assert response.status_code == 400
    assert "'last tuesday' is not a date" in response.content.decode()
    assert not Event.objects.filter(kind="export_began").exists()


def test_csv_cells_a_spreadsheet_would_run_are_escaped(roles):
    reasons = ['=HYPERLINK("http://evil.test","x")', "+1+2", "-3", "@SUM(A1)", "\tTAB", "fine - really"]
    for reason in reasons:
        stop(make_task(), reason=reason)
    client = admin_client(roles)

    rows = csv_rows(client.get(reverse("admin:stopdesk_stoprequest_export", args=["csv"])))
    lines = body(client.get(reverse("admin:stopdesk_stoprequest_export", args=["jsonl"]))).splitlines()

    assert sorted(r["reason"] for r in rows) == sorted(["'" + r for r in reasons[:5]] + ["fine - really"])
    assert sorted(json.loads(line)["reason"] for line in lines) == sorted(reasons)  # programs get the text as is


def test_the_export_streams_through_a_server_side_cursor(roles, monkeypatch):
    task = make_task()
    for _ in range(5):
        make_item(task)
    monkeypatch.setattr("stopdesk.exports.CHUNK_ROWS", 2)
    client = admin_client(roles)

    response = client.get(reverse("admin:stopdesk_event_export", args=["csv"]), {"q": task.pk})
    chunks = iter(response.streaming_content)
    first = next(chunks)
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_cursors WHERE name LIKE '_django_curs_%%'")
        open_cursors = cursor.fetchall()
    rest = b"".join(chunks)

    assert response.streaming
    assert open_cursors, "the rows were not read through a server-side cursor"
    assert first.count(b"\r\n") == 3  # the header and one fetch of two rows, before the rest is read
    assert (first + rest).count(b"\r\n") == 1 + Event.objects.filter(task=task).count()


def test_only_staff_who_may_view_the_list_may_export_it(roles):
    make_item(make_task())
    events = reverse("admin:stopdesk_event_export", args=["csv"])
    items = reverse("admin:stopdesk_workitem_export", args=["csv"])
    reviewer = roles["reviewer"]  # may view items, not the audit log
    as_reviewer = Client()
    as_reviewer.force_login(reviewer)

    assert Client().get(events).status_code == 302  # to the admin's sign-in
    assert as_reviewer.get(items).status_code == 302  # not staff
    reviewer.is_staff = True
    reviewer.save()
    assert as_reviewer.get(events).status_code == 403
    assert as_reviewer.get(items).status_code == 200
    reviewer.user_permissions.add(Permission.objects.get(codename="view_event"))
    assert as_reviewer.get(events).status_code == 200
    assert list(Event.objects.filter(kind="export_began").values_list("actor", flat=True)) == [
        "user:reviewer",
        "user:reviewer",
    ]


def test_every_export_is_an_audit_event_saying_who_and_with_which_filter(roles):
    make_item(make_task())
    client = admin_client(roles)

    client.get(reverse("admin:stopdesk_event_export", args=["jsonl"]), {"kind": "item_registered", "p": "3"})

    event = Event.objects.get(kind="export_began")
    assert event.actor == "user:admin"
    assert event.data == {"what": "events", "format": "JSON Lines", "filters": {"kind": "item_registered"}}
    assert event.message == "Export of events as JSON Lines began (kind=item_registered)."


def test_an_unknown_export_format_is_not_found(roles):
    response = admin_client(roles).get(reverse("admin:stopdesk_event_export", args=["xlsx"]))

    assert response.status_code == 404
    assert not Event.objects.filter(kind="export_began").exists()


def test_every_ledger_list_exports_what_it_lists(roles):
    task = make_task()
    record = make_external_effect(task).external_records.get()
    kept = make_external_effect(task).external_records.get()
    stop(task)
    proposal(record, roles["reviewer"])
    item_escalate(item_id=uncertain_item().pk, to=roles["approver"], reason="Ask them.", by=roles["reviewer"])
    records_accept_as_is(record_ids=[kept.pk], by=roles["reviewer"], note="The customer asked for it.")
    client = admin_client(roles)

    for model_admin in [m for m in admin.site._registry.values() if isinstance(m, ExportMixin)]:
        opts = model_admin.model._meta
        changelist = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")).content.decode()
        lines = body(client.get(link_named(changelist, "Export JSON Lines"))).splitlines()
        assert len(lines) == model_admin.model.objects.count(), opts.model_name
        assert all(isinstance(json.loads(line)["id"], int) for line in lines), opts.model_name
    exported = {m.model._meta.model_name for m in admin.site._registry.values() if isinstance(m, ExportMixin)}
    assert {
        "event",
        "stoprequest",
        "compensation",
        "workitem",
        "escalation",
        "recordreading",
        "recorddecision",
    } <= exported
