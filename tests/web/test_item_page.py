"""The item page: one work item with everything a person needs to decide about it, for each kind of
work, readable by whoever may see its task; the evidence reads as fields, never as Python's text."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse

from reconcile.mechanisms.base import Observation, Seen
from reconcile.services.reconcile import item_observe
from stopdesk.models import WorkItem
from stopdesk.services.items import item_finish
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState, Kind
from stopdesk.templatetags.stopdesk_fields import SEP, readable_fields
from tests.factories import make_item, make_task
from tests.web.conftest import system_url
from tests.web.scenes import crm_effect

pytestmark = pytest.mark.django_db
S = ItemState

# What Python's text for a dict, a list or an ordered mapping looks like in a page (raw, and with
# the quote HTML-escaped).
REPR_MARKS = ("{'", "{&#x27;", "[{", "OrderedDict", "': '", "&#x27;: &#x27;", "': {", "&#x27;: {")


def late_model_request() -> WorkItem:
    """A background response Stop cancelled, which the provider later reported completed."""
    task = make_task("Summarise the supplier contracts")
    item = make_item(
        task, state=S.RUNNING, kind=Kind.MODEL_REQUEST, mechanism="openai", noun="summary", handle="resp_7c1e"
    )
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    item_observe(
        item_id=item.pk,
        observation=Observation(Seen.CANCELLED, remote_status="cancelled", cancel_sent=True),
        action="cancel",
        actor="system:reconcile",
    )
    item_finish(
        item_id=item.pk,
        succeeded=True,
        actor="system:reconcile",
        outcome="completed after the cancel",
        evidence={"remote_status": "completed", "detail": {"usage": {"output_tokens": 812}}},
    )
    item.refresh_from_db()
    return item


def uncertain_remote_tool() -> WorkItem:
    """An MCP tool call whose cancel got no answer: uncertain, with the tool and its arguments."""
    task = make_task("Sync the partner portal")
    item = make_item(
        task,
        state=S.RUNNING,
        kind=Kind.REMOTE_TOOL,
        mechanism="mcp",
        noun="upload",
        label="Upload invoices to the portal",
        handle="mcp-req-42",
        detail={
            "mcp": {
                "server": "partner-portal",
                "tool": "upload_file",
                "arguments": {"path": "/exports/invoices-q3.csv", "overwrite": True},
                "annotations": {"destructiveHint": True, "idempotentHint": False},
                "revision": "2026-07-28",
                "transport": "streamable_http",
                "cancel_wire": "response stream closed",
            }
        },
    )
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    item_observe(
        item_id=item.pk,
        observation=Observation(
            Seen.UNREACHABLE, remote_status="HTTP 503", message="busy", detail={"body": {"error": "overloaded"}}
        ),
        action="cancel",
        actor="system:reconcile",
    )
    item_transition(
        item_id=item.pk,
        to_state=S.UNCERTAIN,
        actor="system:reconcile",
        outcome="outcome unknown; investigate",
        evidence={"last_look": {"seen": "unreachable", "remote_status": "HTTP 503"}},
        message="The remote side did not answer before the mechanism's deadline.",
    )
    item.refresh_from_db()
    return item


def manual_after_stop() -> WorkItem:
    """Work with no status lookup (a person posts the letter) that was running when Stop came,
    after the reconciler's first look: waiting for its result to be reported."""
    from reconcile.services.reconcile import item_reconcile

    task = make_task("Post the renewal letters")
    item = make_item(task, state=S.RUNNING, kind=Kind.EXTERNAL_OPERATION, mechanism="manual", noun="letter")
    task_request_stop(task_id=task.pk, actor="user:operator", dispatch=lambda ids: None)
    item_reconcile(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.AWAITING_RECONCILIATION
    return item


def page(client: Client, item: WorkItem) -> str:
    response = client.get(reverse("item-detail", args=[item.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_a_model_request_page_shows_its_handle_attempts_and_the_late_reports_actual_value(as_user):
    item = late_model_request()
    html = page(as_user("reviewer"), item)
    assert "<code>resp_7c1e</code>" in html and "Model request" in html and "openai" in html
    assert (
        "Recorded <strong>cancelled</strong>; later reported <strong>completed</strong>: completed after the cancel"
        in html
    )
    assert "Not reviewed yet." in html and reverse("item-acknowledge", args=[item.pk]) in html
    # The late report's own evidence, as fields.
    assert "<dt>Remote status</dt><dd>completed</dd>" in html
    assert f"<dt>Detail{SEP}Usage{SEP}Output tokens</dt><dd>812</dd>" in html
    # The cancel that was sent and what came back.
    assert "sent <strong>cancel</strong> via openai" in html and "cancelled (ok)" in html
    # Before and after Stop: it started before, it ended (was recorded cancelled) after.
    assert '<th scope="row">Started</th>' in html and "before Stop" in html and "after Stop" in html
    assert "late result" in html  # the audit event


def test_a_remote_tool_page_shows_the_tool_its_arguments_and_why_it_is_uncertain(as_user):
    item = uncertain_remote_tool()
    html = page(as_user("reviewer"), item)
    assert "<dd><code>upload_file</code> on partner-portal</dd>" in html
    assert (
        "<dt>Protocol</dt><dd>MCP 2026-07-28 over streamable http; on Stop, cancelled by: response stream closed</dd>"
        in html
    )
    assert "<dt>Path</dt><dd>/exports/invoices-q3.csv</dd>" in html and "<dt>Overwrite</dt><dd>yes</dd>" in html
    assert f"<dt>Mcp{SEP}Annotations{SEP}DestructiveHint</dt><dd>yes</dd>" in html
    assert "<strong>Outcome unknown; investigate.</strong>" in html and "Investigate by" in html
    assert "Why: The remote side did not answer before the mechanism&#x27;s deadline." in html
    assert "HTTP 503 (not ok)" in html and f"<dt>Body{SEP}Error</dt><dd>overloaded</dd>" in html
    for name in ("item-resolve", "item-extend", "item-escalate"):
        assert reverse(name, args=[item.pk]) in html
    assert f"Resolve #{item.pk}…" in html


def test_an_external_operation_page_shows_its_key_record_version_and_link(crm, as_user):
    record = crm_effect(system_url("crm"), before_stop=True)
    item = record.item
    html = page(as_user("reviewer"), item)
    assert f'<code class="key">{item.idempotency_key}</code>' in html and item.idempotency_key.startswith("onboard-")
    assert f'href="{record.link}"' in html and f">{record.record_id}</a>" in html
    assert f"version <code>{record.version}</code>" in html and "reversible (archive)" in html
    assert "(before Stop)" in html  # recorded before the task was stopped
    assert reverse("record-propose", args=[record.pk]) in html
    assert reverse("task-detail", args=[item.task_id]) in html


def test_a_manual_item_after_stop_shows_when_it_turns_uncertain_and_offers_a_report(as_user):
    item = manual_after_stop()
    html = page(as_user("reviewer"), item)
    assert "Waiting for its result to be reported." in html
    deadline = item.cancel_requested_at.timestamp() + 3600
    assert "If nothing is reported it turns <strong>uncertain</strong> at" in html
    assert f"{item.next_check_at.timestamp():.0f}" == f"{deadline:.0f}"  # the engine looks again then
    assert reverse("item-report", args=[item.pk]) in html and f"Report #{item.pk}" in html


def test_operators_and_approvers_read_the_page_without_any_action(as_user):
    items = [uncertain_remote_tool(), manual_after_stop(), late_model_request()]
    for person in ("operator", "approver"):
        client = as_user(person)
        for item in items:
            html = page(client, item)
            for name in ("item-resolve", "item-report", "item-acknowledge", "item-extend", "item-escalate"):
                assert reverse(name, args=[item.pk]) not in html, (person, name)


def test_anonymous_is_sent_to_sign_in_and_a_person_without_a_role_is_refused(django_user_model):
    item = uncertain_remote_tool()
    url = reverse("item-detail", args=[item.pk])
    response = Client().get(url)
    assert response.status_code == 302 and response["Location"].startswith(reverse("login"))
    nobody = django_user_model.objects.create_user("nobody", password="nobody-pass-123")
    client = Client()
    client.force_login(nobody)
    assert client.get(url).status_code == 403


def test_an_item_that_does_not_exist_is_not_found(as_user):
    assert as_user("operator").get(reverse("item-detail", args=[999999])).status_code == 404


def test_the_task_page_and_its_item_lists_link_to_each_item_page(as_user):
    item = uncertain_remote_tool()
    client = as_user("reviewer")
    task_page = client.get(reverse("task-detail", args=[item.task_id])).content.decode()
    assert reverse("item-detail", args=[item.pk]) in task_page
    items_page = client.get(reverse("task-items", args=[item.task_id]), {"state": S.UNCERTAIN}).content.decode()
    assert reverse("item-detail", args=[item.pk]) in items_page


def test_the_tasks_uncertain_items_page_offers_resolve_to_reviewers_only(as_user):
    item = uncertain_remote_tool()
    url = reverse("task-items", args=[item.task_id])
    resolve = reverse("item-resolve", args=[item.pk])
    assert resolve in as_user("reviewer").get(url, {"state": S.UNCERTAIN}).content.decode()
    assert f"Resolve #{item.pk}…" in as_user("reviewer").get(url, {"state": S.UNCERTAIN}).content.decode()
    assert resolve not in as_user("operator").get(url, {"state": S.UNCERTAIN}).content.decode()


def test_resolving_from_the_tasks_uncertain_items_page_settles_the_item(as_user):
    item = uncertain_remote_tool()
    response = as_user("reviewer").post(
        reverse("item-resolve", args=[item.pk]),
        {"outcome": S.FAILED, "note": "Portal shows no upload.", "evidence": "Portal audit log, 14:02"},
    )
    assert response.status_code == 302
    assert WorkItem.objects.get(pk=item.pk).state == S.FAILED


@pytest.mark.usefixtures("crm")
def test_no_page_shows_python_text_for_stored_json(as_user):
    items = [late_model_request(), uncertain_remote_tool(), manual_after_stop(), crm_effect(system_url("crm")).item]
    client = as_user("reviewer")
    urls = [reverse("review-queue")]
    for item in items:
        urls.append(reverse("task-detail", args=[item.task_id]))
        urls += [f"{reverse('task-items', args=[item.task_id])}?state={state}" for state in S.values]
    pages = [*urls, *(("item-detail", item.pk) for item in items)]
    for url in pages:
        if isinstance(url, tuple):
            url = reverse(url[0], args=[url[1]])
        html = client.get(url).content.decode()
        found = [mark for mark in REPR_MARKS if mark in html]
        assert not found, (url, found)


def test_readable_fields_name_nested_values_and_never_show_python_text():
    fields = readable_fields(
        {"uncertain_because": "no answer", "last_look": {"ok": False, "tried": [1, 2]}, "rows": [{"id": "a"}]}
    )
    assert fields == [
        ("Uncertain because", "no answer"),
        (f"Last look{SEP}Ok", "no"),
        (f"Last look{SEP}Tried", "1, 2"),
        (f"Rows{SEP}1{SEP}Id", "a"),
    ]
    assert readable_fields({}) == [] and readable_fields({"gone": None}) == [("Gone", "—")]
    assert readable_fields({"at": "2026-12-01T14:56:03.162539+00:00"}) == [("At", "Dec 1, 14:56:03")]


def _looks(item: WorkItem, n: int) -> None:
    for _ in range(n):
        item_observe(
            item_id=item.pk,
            observation=Observation(Seen.UNREACHABLE, remote_status="HTTP 503"),
            action="inspect",
            actor="system:reconcile",
        )


def test_the_page_runs_the_same_queries_however_many_attempts_and_events_an_item_has(as_user):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    few, many = uncertain_remote_tool(), uncertain_remote_tool()
    _looks(many, 30)
    client = as_user("reviewer")
    counts = []
    for item in (few, many):
        with CaptureQueriesContext(connection) as queries:
            page(client, item)
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1]


def test_an_item_with_a_long_trail_shows_its_latest_events(as_user, monkeypatch):
    from stopdesk.views import item_page

    monkeypatch.setattr(item_page, "EVENT_LIMIT", 3)
    item = uncertain_remote_tool()
    item_transition(item_id=item.pk, to_state=S.FAILED, actor="user:reviewer", outcome="portal shows no upload")
    html = page(as_user("reviewer"), item)
    events = html[html.index('id="events-title"') :]
    assert "uncertain → failed" in events.replace("</span>", "").replace('<span class="muted">', "")
    assert "item registered" not in events
    assert "The latest 3 of 5 shown" in events
