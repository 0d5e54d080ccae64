"""The review queue on a bad day: uncertain items grouped with counts, a filter, a search and
"mine"; decisions on a whole group from beside it; rows that name their item; a header that never
says nothing waits while something does."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from stopdesk.models import Event, WorkItem
from stopdesk.services.items import item_finish
from stopdesk.services.stop import task_request_stop
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState
from tests.factories import make_item, make_task
from tests.web.conftest import htmx, system_url
from tests.web.queue_scenes import bad_day, unknown_call
from tests.web.scenes import crm_effect

pytestmark = pytest.mark.django_db
S = ItemState


def _groups(html: str) -> int:
    return html.count('<section class="group" id="group-')


def test_the_queue_groups_items_by_task_system_tool_and_reason_with_counts(as_user):
    bad_day(sizes=(12, 7, 3))
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert _groups(html) == 3
    assert "Select all 12 in this group" in html and "Select all 7 in this group" in html
    assert "payments.refund in payments" in html and "The CRM answered 503 to every status lookup." in html
    assert html.index("payments.refund") < html.index("crm.create_record")  # biggest group first


def test_grouping_by_one_dimension_merges_groups(as_user):
    bad_day(sizes=(4, 3, 2))
    html = as_user("reviewer").get(reverse("review-queue"), {"group_by": "task"}).content.decode()
    assert _groups(html) == 2 and "Select all 5 in this group" in html


def test_search_finds_items_by_idempotency_key_tool_or_reason(as_user):
    groups = bad_day(sizes=(3, 3, 3))
    client = as_user("reviewer")
    key = groups[1][0].idempotency_key
    by_key = client.get(reverse("review-queue"), {"q": key}, **htmx("uncertain")).content.decode()
    assert f'id="uncertain-{groups[1][0].pk}"' in by_key and by_key.count('class="row qitem"') == 1
    by_reason = client.get(reverse("review-queue"), {"q": "timed out"}, **htmx("uncertain")).content.decode()
    assert by_reason.count('class="row qitem"') == 3 and "payments.refund" in by_reason


def test_mine_is_my_tasks_the_tasks_i_stopped_and_items_escalated_to_me(as_user, roles):
    mine_owned = make_task("My own run")
    mine_owned.owner = roles["reviewer"]
    mine_owned.save(update_fields=["owner"])
    owned = unknown_call(mine_owned)
    stopped_task = make_task("Run I stopped")
    stopped = unknown_call(stopped_task)
    task_request_stop(task_id=stopped_task.pk, actor="user:reviewer", by=roles["reviewer"], dispatch=lambda ids: None)
    other = unknown_call(make_task("Someone else's run"))
    html = as_user("reviewer").get(reverse("review-queue"), {"mine": "1"}).content.decode()
    assert f'id="uncertain-{owned.pk}"' in html and f'id="uncertain-{stopped.pk}"' in html
    assert f'id="uncertain-{other.pk}"' not in html


def test_resolving_all_in_a_group_reaches_the_items_beyond_its_first_rows(as_user):
    refunds, crm, _ = bad_day(sizes=(30, 5, 2))
    client = as_user("reviewer")
    page = client.get(reverse("review-queue")).content.decode()
    assert page.count('class="row qitem"') < 37  # only the first rows of each group are on the page
    response = client.post(
        reverse("queue-decide"),
        {
            "all": "1",
            "tool": "payments.refund",
            "system": "payments",
            "task": refunds[0].task_id,
            "error": "The payment provider timed out on every lookup.",
            "action": "resolve",
            "outcome": S.FAILED,
            "note": "Provider shows none of these refunds",
            "evidence": "Provider search by key, 14:02",
        },
        **htmx("group-x"),
    )
    html = response.content.decode()
    assert response.status_code == 200 and "Resolved 30 items as failed, each with its own audit event." in html
    assert set(WorkItem.objects.filter(pk__in=[i.pk for i in refunds]).values_list("state", flat=True)) == {S.FAILED}
    assert Event.objects.filter(kind="resolved").count() == 30
    assert set(WorkItem.objects.filter(pk__in=[i.pk for i in crm]).values_list("state", flat=True)) == {S.UNCERTAIN}


def test_a_few_ticked_rows_are_decided_and_the_group_comes_back_without_them(as_user):
    _, crm, _ = bad_day(sizes=(2, 5, 1))
    client = as_user("reviewer")
    page = client.get(reverse("review-queue"), {"tool": "crm.create_record"}).content.decode()
    slug = page.split('<section class="group" id="group-')[1].split('"')[0]
    response = client.post(
        reverse("queue-decide"),
        {
            "item": [crm[0].pk, crm[1].pk],
            "tool": "crm.create_record",
            "action": "extend",
            "hours": 48,
            "note": "CRM support ticket open",
        },
        **htmx(f"group-{slug}"),
    )
    html = response.content.decode()
    assert html.lstrip().startswith(f'<section class="group" id="group-{slug}"')
    assert "Extended the deadline of 2 items" in html and "Select all 5 in this group" in html
    assert Event.objects.filter(kind="deadline_extended", message="CRM support ticket open").count() == 2


def test_a_bulk_decision_without_a_note_is_refused_and_writes_nothing(as_user):
    refunds, _, _ = bad_day(sizes=(3, 1, 1))
    response = as_user("reviewer").post(
        reverse("queue-decide"),
        {"item": [i.pk for i in refunds], "action": "resolve", "outcome": S.FAILED, "note": "", "evidence": "x"},
        **htmx("group-x"),
    )
    assert response.status_code == 400 and "Nothing was changed: A resolution needs a note" in response.content.decode()
    assert not Event.objects.filter(kind="resolved").exists()


def test_a_bulk_decision_needs_the_reviewer_role(as_user):
    refunds, _, _ = bad_day(sizes=(1, 1, 1))
    response = as_user("operator").post(
        reverse("queue-decide"),
        {"item": [refunds[0].pk], "action": "resolve", "outcome": S.FAILED, "note": "n", "evidence": "e"},
    )
    assert response.status_code == 403 and not Event.objects.filter(kind="resolved").exists()


def test_a_plain_form_post_redirects_back_to_the_queue_with_a_message(as_user):
    refunds, _, _ = bad_day(sizes=(2, 1, 1))
    client = as_user("reviewer")
    response = client.post(
        reverse("queue-decide"),
        {"item": [i.pk for i in refunds], "action": "resolve", "outcome": S.FAILED, "note": "n", "evidence": "e"},
        follow=True,
    )
    assert "Resolved 2 items as failed" in response.content.decode()


def test_each_rows_buttons_name_their_item_and_link_its_page(as_user):
    item = unknown_call(make_task("Vendor sync"), tool="crm.create_record")
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert f'aria-label="Resolve item {item.pk}: crm.create_record"' in html
    assert f'aria-label="Select item {item.pk}: crm.create_record"' in html
    assert f'href="/items/{item.pk}/"' in html
    assert item.idempotency_key in html and "The CRM answered 503" in html


def test_the_required_note_is_marked_required(as_user):
    bad_day(sizes=(1, 1, 1))
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert 'Note <span class="req">(required)</span>' in html and 'name="note" rows="2" required' in html


def test_resolving_beside_a_row_replaces_only_that_row(as_user):
    item = unknown_call(make_task("Vendor sync"))
    response = as_user("reviewer").post(
        reverse("item-resolve", args=[item.pk]),
        {"outcome": S.COMPLETED, "note": "Record exists", "evidence": "crm id 881"},
        **htmx(f"uncertain-{item.pk}"),
    )
    html = response.content.decode()
    assert response.status_code == 200 and html.lstrip().startswith(
        f'<li class="row qitem done" id="uncertain-{item.pk}"'
    )
    assert "Resolved record #" in html and "<html" not in html


def test_a_refused_decision_beside_a_row_comes_back_into_its_panel(as_user):
    item = unknown_call(make_task("Vendor sync"))
    response = as_user("reviewer").post(
        reverse("item-resolve", args=[item.pk]), {"outcome": S.COMPLETED, "note": ""}, **htmx(f"uncertain-{item.pk}")
    )
    assert response.status_code == 400 and response["HX-Retarget"] == f"#panel-{item.pk}"


def test_the_header_does_not_say_nothing_waits_while_a_late_result_waits(as_user):
    item = make_item(make_task("Invoice batch 7"), state=S.RUNNING)
    item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="test")
    item_finish(item_id=item.pk, succeeded=True, actor="system:reconcile", outcome="completed after cancel")
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    facts = html.split('id="queue-facts">')[1].split("</p>")[0]
    assert "Nothing is waiting" not in facts and "<strong>1</strong> waiting for a person" in facts


def test_the_header_does_not_say_nothing_waits_while_an_effect_from_before_stop_waits(as_user, crm):
    crm_effect(system_url("crm"), before_stop=True)
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    facts = html.split('id="queue-facts">')[1].split("</p>")[0]
    assert "Nothing is waiting" not in facts and "<strong>1</strong> waiting for a person" in facts


def test_the_header_says_nothing_waits_when_nothing_does(as_user):
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert "Nothing is waiting." in html


def test_the_queue_reads_the_same_number_of_queries_for_three_groups_and_thirty(as_user):
    client = as_user("reviewer")
    bad_day(sizes=(10, 10, 10))

    def queries() -> int:
        with CaptureQueriesContext(connection) as seen:
            assert client.get(reverse("review-queue")).status_code == 200
        return len(seen.captured_queries)

    few = queries()
    for n in range(27):
        unknown_call(make_task(f"Run {n}"), tool=f"tool.{n}")
    assert queries() == few


def _late(n: int) -> list[WorkItem]:
    task = make_task("Invoice batch 7")
    items = []
    for _ in range(n):
        item = make_item(task, state=S.RUNNING, label="Vendor letter draft")
        item_transition(item_id=item.pk, to_state=S.CANCELLED, actor="test")
        item_finish(item_id=item.pk, succeeded=True, actor="system:reconcile", outcome="completed after cancel")
        items.append(item)
    return items


def test_all_late_results_are_reviewed_with_one_note_and_the_section_swapped_in_place(as_user):
    late = _late(3)
    response = as_user("reviewer").post(
        reverse("queue-acknowledge"), {"all": "1", "note": "Drafts only; nothing left the building"}, **htmx("late")
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="late"') and "Reviewed the late results of 3 items" in html
    assert not WorkItem.objects.filter(pk__in=[i.pk for i in late], needs_review=True).exists()
    assert Event.objects.filter(kind="late_result_acknowledged").count() == 3


def test_reviewing_late_results_without_a_note_is_refused(as_user):
    late = _late(1)
    response = as_user("reviewer").post(
        reverse("queue-acknowledge"), {"item": [late[0].pk], "note": ""}, **htmx("late")
    )
    assert response.status_code == 400 and "Nothing was changed" in response.content.decode()
    assert WorkItem.objects.get(pk=late[0].pk).needs_review


def test_a_late_result_is_reviewed_beside_its_row(as_user):
    item = _late(1)[0]
    client = as_user("reviewer")
    html = client.get(reverse("review-queue")).content.decode()
    assert f'aria-label="Review the late result of item {item.pk}: Vendor letter draft"' in html
    assert f'hx-target="#late-panel-{item.pk}"' in html
    response = client.post(
        reverse("item-acknowledge", args=[item.pk]), {"note": "Harmless draft"}, **htmx(f"late-{item.pk}")
    )
    assert response.content.decode().lstrip().startswith(f'<li class="row qitem done" id="late-{item.pk}"')


def test_a_swapped_group_brings_the_headers_true_count_along(as_user):
    refunds, _, _ = bad_day(sizes=(3, 2, 1))
    response = as_user("reviewer").post(
        reverse("queue-decide"),
        {"item": [i.pk for i in refunds], "action": "resolve", "outcome": S.FAILED, "note": "n", "evidence": "e"},
        **htmx("group-x"),
    )
    html = response.content.decode()
    facts = html.split('id="queue-facts" hx-swap-oob="true">')[1].split("</p>")[0]
    assert "<strong>3</strong> waiting for a person" in facts


def _all_refunds(refunds: list[WorkItem], expected: int) -> dict[str, object]:
    return {
        "all": "1",
        "expected": expected,
        "tool": "payments.refund",
        "system": "payments",
        "task": refunds[0].task_id,
        "error": "The payment provider timed out on every lookup.",
        "action": "resolve",
        "outcome": S.FAILED,
        "note": "Provider shows none of these refunds",
        "evidence": "Provider search by key",
    }


def test_all_in_a_group_that_grew_since_the_page_was_read_is_refused_and_keeps_the_note(as_user):
    refunds, _, _ = bad_day(sizes=(4, 1, 1))
    unknown_call(
        WorkItem.objects.get(pk=refunds[0].pk).task,
        tool="payments.refund",
        system="payments",
        reason="The payment provider timed out on every lookup.",
    )
    client = as_user("reviewer")
    page = client.get(reverse("review-queue"), {"tool": "payments.refund"}).content.decode()
    slug = page.split('<section class="group" id="group-')[1].split('"')[0]
    response = client.post(reverse("queue-decide"), _all_refunds(refunds, 4), **htmx(f"group-{slug}"))
    html = response.content.decode()
    assert response.status_code == 400 and "it has 5 items now, not 4" in html
    assert "Provider shows none of these refunds</textarea>" in html
    assert not Event.objects.filter(kind="resolved").exists()


def test_all_in_a_group_that_shrank_says_how_many_had_moved(as_user, roles):
    from reconcile.services.review import item_resolve

    refunds, _, _ = bad_day(sizes=(5, 1, 1))
    for item in refunds[:2]:
        item_resolve(item_id=item.pk, outcome=S.COMPLETED, note="found", evidence="receipt", by=roles["reviewer"])
    response = as_user("reviewer").post(reverse("queue-decide"), _all_refunds(refunds, 5), **htmx("group-x"))
    html = response.content.decode()
    assert "Resolved 3 items as failed" in html and "2 of the 5 you saw had been decided or had moved" in html
    assert WorkItem.objects.filter(pk__in=[i.pk for i in refunds[:2]], state=S.COMPLETED).count() == 2


def test_each_groups_controls_name_their_group(as_user):
    bad_day(sizes=(2, 1, 1))
    html = as_user("reviewer").get(reverse("review-queue")).content.decode()
    assert 'Apply to selected<span class="hidden-text"> in payments.refund in payments</span>' in html
    assert 'Decide selected…<span class="hidden-text"> in crm.create_record in crm</span>' in html


@pytest.mark.parametrize("name", ["queue-decide", "queue-acknowledge"])
def test_bulk_decisions_need_a_signed_in_reviewer_and_a_post(client, as_user, name):
    refunds, _, _ = bad_day(sizes=(1, 1, 1))
    form = {"item": [refunds[0].pk], "action": "resolve", "outcome": S.FAILED, "note": "n", "evidence": "e"}
    anonymous = client.post(reverse(name), form)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert as_user("approver").post(reverse(name), form).status_code == 403
    assert as_user("reviewer").get(reverse(name)).status_code == 405
    assert not Event.objects.filter(kind__in=("resolved", "late_result_acknowledged")).exists()
