"""Work a response launched, recorded as it really ended: each launched call's record follows the
later read-backs, says whether it ran before or after Stop, and tells an effect by what it did.

Against the OpenAI stand-in, stopped mid-flight, on both canceller paths: one item at a time
(`item_cancel`) and the batched canceller (`items_cancel`, more responses than Stop cancels one
job each)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from reconcile.mechanisms.openai.adapter import launched_tool_calls
from reconcile.mechanisms.openai.agent import response_create
from reconcile.mechanisms.openai.sandbox import FLIP_TO_COMPLETED
from reconcile.mechanisms.openai.sandbox_model import HostedMcpCall, Script, ToolCall, Turn
from reconcile.services.cancel import item_cancel, items_cancel
from reconcile.services.launched import NEVER_RAN, tool_effect
from reconcile.tasks import BATCH_ABOVE
from stopdesk.models import Event, ExternalRecord, Task, WorkItem
from stopdesk.review_state import needs_review
from stopdesk.services.items import item_register
from stopdesk.states import Effect, ItemState, Kind
from stopdesk.summary import number_word, task_summary
from tests.factories import make_task
from tests.reconcile.helpers import stop

S = ItemState
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]
PATHS = ["single", "batched"]


def _count(path: str) -> int:
    return 1 if path == "single" else BATCH_ABOVE + 1


def _cancel(path: str, item_ids: list[int], now: Any = None) -> None:
    if path == "single":
        for item_id in item_ids:
            item_cancel(item_id=item_id, now=now)
    else:
        items_cancel(item_ids=item_ids, mechanism="openai", now=now)


def _stopped(
    path: str, openai_party: Any, script: Script, capture: Callable[..., Any], *, flip: bool = False
) -> tuple[Task, list[WorkItem]]:
    """Drafts whose background responses launched `script`'s calls, stopped mid-flight: the cancel
    and its read-back through `path`. With `flip`, each cancelled response turns completed later."""
    party, url = openai_party
    model = party.load_script(script)
    task = make_task()
    count = _count(path)
    if flip:
        party.arm(FLIP_TO_COMPLETED, times=count)
        # The flip comes when the test says (`_read_back_after_the_flip`), never during the cancel's
        # own read-back, however long a batch of them takes on a busy machine.
        party.flip_after_s = 3600.0
    items = [
        item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
        for _ in range(count)
    ]
    for item in items:
        response_create(item_id=item.pk, actor="test", base_url=url, model=model, input="Go", timeout_s=10.0)
    time.sleep(0.05)  # past `queued`: the hosted calls are under way
    dispatched = stop(task, capture)
    assert sorted(dispatched) == sorted(i.pk for i in items)
    _cancel(path, dispatched)
    return Task.objects.get(pk=task.pk), items  # as stopped


def _read_back_after_the_flip(path: str, items: list[WorkItem], party: Any) -> None:
    """The flip watch's read-back, once the cancelled responses have turned completed."""
    assert party.flip_now() == len(items)
    due = [WorkItem.objects.get(pk=i.pk).next_check_at for i in items]
    assert all(d is not None for d in due)
    _cancel(path, [i.pk for i in items], now=max(d for d in due if d is not None) + timedelta(seconds=1))
    assert all(WorkItem.objects.get(pk=i.pk).evidence.get("late_result") for i in items)  # it did read back


def _child(item: WorkItem, label: str) -> WorkItem:
    return WorkItem.objects.get(parent=item, label=label)


def _in_review(item: WorkItem) -> bool:
    return WorkItem.objects.filter(needs_review(), pk=item.pk).exists()


EFFECTS = Script.build(
    "effects",
    [
        Turn(
            mcp_calls=(
                HostedMcpCall("web", "search", {"q": "acme"}, kind="web_search_call", status="completed"),
                HostedMcpCall(
                    "crm", "send_email", {"to": "ceo@acme.example", "subject": "Offer"}, output="queued for delivery"
                ),
                HostedMcpCall("crm", "create_record", {"name": "Acme"}, output='{"id": "acc-7", "version": 2}'),
            ),
            text="working on it",
        )
    ],
)


@pytest.mark.parametrize("path", PATHS)
def test_a_completed_hosted_call_not_known_read_only_is_an_effect_kept_flagged_and_told_by_what_it_did(
    path, openai_party, django_capture_on_commit_callbacks
):
    """(a) A hosted `crm.send_email` that completed: its arguments (who the mail went to) kept, an
    effect record, flagged for review, and told as an email sent, never as a completed call beside
    the web search. A record the CRM output names is reversible: the CRM is configured with one."""
    task, items = _stopped(path, openai_party, EFFECTS, django_capture_on_commit_callbacks)
    for item in items:
        email = _child(item, "crm.send_email")
        assert email.state == S.COMPLETED and email.needs_review and _in_review(email)
        assert email.detail["launched"]["arguments"] == {"to": "ceo@acme.example", "subject": "Offer"}
        [sent] = ExternalRecord.objects.filter(item=email)
        assert (sent.system, sent.effect, sent.reversible) == ("crm", Effect.SENT, False)
        created = ExternalRecord.objects.get(item=_child(item, "crm.create_record"))
        assert (created.record_id, created.version, created.reversible, created.reversal) == (
            "acc-7",
            "2",
            True,
            "archive",
        )
        search = _child(item, "web_search_call")
        assert search.state == S.COMPLETED and not _in_review(search)
        assert not ExternalRecord.objects.filter(item=search).exists()

    n = number_word(len(items))
    summary = task_summary(task)
    one, many = ("One email", "One record") if n == "one" else (f"{n} emails", f"{n} records")
    assert (
        f"{one} sent by a hosted tool; {'it' if n == 'one' else 'they'} cannot be recalled; review required." in summary
    )
    assert f"{many} created by a hosted tool; review required." in summary
    calls = "hosted tool call" if n == "one" else "hosted tool calls"
    assert f"{n.capitalize()} {calls} completed." in summary  # the search alone
    assert "Three hosted tool calls completed" not in summary
    if path == "single":
        assert summary == (
            "Stopped new work. One record created by a hosted tool; review required. One email sent by a hosted "
            "tool; it cannot be recalled; review required. One draft discarded. One hosted tool call completed."
        )


FOLLOWED = Script.build(
    "followed",
    [
        Turn(
            mcp_calls=(
                HostedMcpCall(
                    "web",
                    "search",
                    {"q": "acme"},
                    kind="web_search_call",
                    status="in_progress",
                    final_status="completed",
                ),
                HostedMcpCall("crm", "update_record", {"id": "acc-1"}, status="calling", final_status="completed"),
            ),
            text="working on it",
        )
    ],
)


@pytest.mark.parametrize("path", PATHS)
def test_a_call_recorded_at_one_read_back_follows_what_a_later_one_reports(
    path, openai_party, django_capture_on_commit_callbacks
):
    """(b) A web search recorded stopped at the cancelled read-back, reported completed after the
    response flipped: a late result, flagged, no longer "stopped before it finished". A call the
    provider was still running (uncertain) settles completed, an effect that finished after Stop."""
    task, items = _stopped(path, openai_party, FOLLOWED, django_capture_on_commit_callbacks, flip=True)
    assert {c.label: c.state for c in WorkItem.objects.filter(parent=items[0])} == {
        "web_search_call": S.CANCELLED,
        "crm.update_record": S.UNCERTAIN,
    }
    assert "stopped before it finished" in task_summary(task) or "stopped before they finished" in task_summary(task)

    _read_back_after_the_flip(path, items, openai_party[0])

    for item in items:
        search = _child(item, "web_search_call")
        assert search.state == S.CANCELLED  # a terminal record is never overwritten
        assert search.evidence["late_result"]["reported"] == S.COMPLETED and search.needs_review
        assert Event.objects.filter(item=search, kind="late_result").count() == 1
        assert search.detail["launched"]["status"] == "completed"
        update = _child(item, "crm.update_record")
        assert update.state == S.COMPLETED and update.needs_review
        assert update.outcome.startswith("finished after Stop")
        assert ExternalRecord.objects.get(item=update).effect == Effect.UPDATED
    summary = task_summary(task)
    assert "stopped before" not in summary
    n = number_word(len(items))
    late = "a late report contradicts its record" if n == "one" else "late reports contradict their records"
    calls = "hosted tool call" if n == "one" else "hosted tool calls"
    assert f"{n.capitalize()} {calls} completed; {late}: review required." in summary
    assert f"{'One record' if n == 'one' else f'{n} records'} updated by a hosted tool after Stop;" in summary


ENDED_OTHERWISE = Script.build(
    "ended-otherwise",
    [
        Turn(
            mcp_calls=(
                HostedMcpCall(
                    "crm",
                    "update_record",
                    {"id": "acc-2"},
                    status="calling",
                    final_status="failed",
                    error="conflict: the record changed",
                ),
                HostedMcpCall("crm", "archive_record", {"id": "acc-3"}, status="calling", final_status="incomplete"),
            ),
            text="working on it",
        )
    ],
)


@pytest.mark.parametrize("path", PATHS)
def test_a_call_the_provider_later_reports_failed_or_incomplete_is_recorded_as_it_ended(
    path, openai_party, django_capture_on_commit_callbacks
):
    """Two calls the provider was still running at the cancelled read-back (uncertain), then
    reported ended otherwise: one failed (settled failed with its error's text, no effect, no
    review), one incomplete (still uncertain, since it ended partway and may have acted, but no
    longer told "still running")."""
    task, items = _stopped(path, openai_party, ENDED_OTHERWISE, django_capture_on_commit_callbacks, flip=True)
    assert {c.label: c.state for c in WorkItem.objects.filter(parent=items[0])} == {
        "crm.update_record": S.UNCERTAIN,
        "crm.archive_record": S.UNCERTAIN,
    }

    _read_back_after_the_flip(path, items, openai_party[0])

    for item in items:
        failed = _child(item, "crm.update_record")
        assert failed.state == S.FAILED and not _in_review(failed)
        assert "the provider reports it failed" in failed.outcome and "conflict: the record changed" in failed.outcome
        assert not ExternalRecord.objects.filter(item=failed).exists()
        assert failed.detail["launched"]["status"] == "failed"
        partway = _child(item, "crm.archive_record")
        assert partway.state == S.UNCERTAIN and partway.investigate_by is not None and _in_review(partway)
        assert partway.detail["launched"]["status"] == "incomplete"
        assert partway.evidence["launched_ended"]["why"] == (
            "the provider reports it incomplete: it ended partway and may have acted"
        )
        assert Event.objects.filter(item=partway, kind="evidence").exists()
    summary = task_summary(task)
    n = number_word(len(items)).capitalize()
    calls = "hosted tool call" if n == "One" else "hosted tool calls"
    assert f"{n} {calls} with unknown outcome; review required." in summary
    assert f"{n} {calls} failed." in summary
    assert "still running" not in summary and "stopped before" not in summary


LATE = Script.build(
    "late",
    [
        Turn(
            mcp_calls=(
                HostedMcpCall("docs", "search", {"q": "acme"}, status="completed", output="3 pages"),
                HostedMcpCall("crm", "create_record", {"name": "Acme"}, late=True),
            ),
            text="working on it",
        )
    ],
)


@pytest.mark.parametrize("path", PATHS)
def test_a_call_that_ran_after_the_cancel_is_flagged_as_work_done_after_stop(
    path, openai_party, django_capture_on_commit_callbacks
):
    """(c) A call absent from the cancelled read-back and completed after the flip ran after Stop:
    flagged, dated no earlier than the read-back that recorded the response cancelled (not from
    the draft's start), and told as done after Stop."""
    task, items = _stopped(path, openai_party, LATE, django_capture_on_commit_callbacks, flip=True)
    assert not WorkItem.objects.filter(parent__in=items, label="crm.create_record").exists()
    before = _child(items[0], "docs.search")
    assert before.detail["launched"]["when"] == "before_cancel"

    _read_back_after_the_flip(path, items, openai_party[0])

    for item in items:
        item.refresh_from_db()
        late = _child(item, "crm.create_record")
        assert late.state == S.COMPLETED and late.needs_review and _in_review(late)
        assert late.detail["launched"]["when"] == "after_cancel"
        assert late.outcome.startswith("ran after Stop")
        assert item.finished_at is not None and late.started_at is not None and late.started_at >= item.finished_at
        assert ExternalRecord.objects.get(item=late).effect == Effect.CREATED
    n = number_word(len(items))
    records = "One record" if n == "one" else f"{n} records"
    assert f"{records} created by a hosted tool after Stop;" in task_summary(task)


NEVER = Script.build(
    "never",
    [
        Turn(
            mcp_calls=(
                HostedMcpCall("crm", "delete_record", {"id": "9"}, status="failed", error="forbidden: not your record"),
            ),
            tool_calls=(ToolCall("send_invoice", {"to": "acme"}),),
            text="working on it",
        )
    ],
)


@pytest.mark.parametrize("path", PATHS)
def test_a_function_call_the_application_never_ran_reads_never_ran_and_an_mcp_error_is_text(
    path, openai_party, django_capture_on_commit_callbacks
):
    """(d) A function call left for the application, which the stop kept from running, never
    started; the summary says it never ran. An MCP tool's error is kept as its text."""
    task, items = _stopped(path, openai_party, NEVER, django_capture_on_commit_callbacks)
    for item in items:
        function = _child(item, "send_invoice")
        assert function.state == S.CANCELLED and function.started_at is None
        assert function.outcome == NEVER_RAN
        assert function.detail["launched"]["arguments"] == {"to": "acme"}
        failed = _child(item, "crm.delete_record")
        assert failed.state == S.FAILED
        assert failed.detail["launched"]["error"] == "forbidden: not your record"
        assert failed.outcome == "the provider reports it failed: forbidden: not your record"
    summary = task_summary(task)
    n = number_word(len(items))
    assert f"{n.capitalize()} tool call{'' if n == 'one' else 's'} never ran." in summary
    assert "stopped before" not in summary
    if path == "single":
        assert summary == "Stopped new work. One draft discarded. One tool call never ran. One hosted tool call failed."


@pytest.mark.parametrize(
    ("tool", "said"),
    [
        ("send_email", (Effect.SENT, "email")),
        ("createRecord", (Effect.CREATED, "record")),
        ("email_customer", (Effect.SENT, "email")),
        ("gmail_send_message", (Effect.SENT, "message")),
        ("archive", (Effect.ARCHIVED, "record")),
        ("lookup_account", None),
    ],
)
def test_a_tools_name_says_what_it_did_or_nothing(tool, said):
    assert tool_effect(tool) == said


def test_a_calls_facts_keep_its_arguments_its_named_record_and_its_errors_text():
    [call] = launched_tool_calls(
        {
            "output": [
                {
                    "type": "mcp_call",
                    "id": "mcp_1",
                    "server_label": "crm",
                    "name": "create_record",
                    "arguments": '{"name": "Acme"}',
                    "output": '{"id": "acc-7", "version": 2, "notes": "private"}',
                    "status": "failed",
                    "error": {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": "quota"}]},
                }
            ]
        }
    )
    assert call["arguments"] == {"name": "Acme"}
    assert call["record"] == {"id": "acc-7", "version": "2"}  # never the output itself
    assert call["error"] == "quota"
    # An id that cannot be one path segment names no record (the ledger would refuse the call).
    [odd] = launched_tool_calls({"output": [{"type": "mcp_call", "id": "mcp_2", "output": '{"id": "../admin"}'}]})
    assert odd["record"] is None
