import pytest

from stopdesk.services.items import item_finish, item_note_evidence, item_register
from stopdesk.services.stop import task_request_stop
from stopdesk.states import ItemState as S
from stopdesk.states import Kind
from stopdesk.summary import task_summary
from tests.factories import make_external_effect, make_item, make_task

pytestmark = pytest.mark.django_db


def _stop(task):
    task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None)
    task.refresh_from_db()
    return task_summary(task)


def test_the_canonical_sentence_two_drafts_discarded_one_record_created():
    task = make_task()
    make_item(task, noun="draft")
    make_item(task, noun="draft")
    make_external_effect(task, noun="record", effect="created", reversible=True)
    assert _stop(task) == "Stopped new work. One record created; review required. Two drafts discarded."


def test_nothing_to_stop_when_everything_had_finished():
    task = make_task()
    make_item(task, state=S.COMPLETED, noun="draft")
    make_item(task, state=S.COMPLETED, noun="draft")
    assert _stop(task) == "Stop requested; nothing was left to stop. Two drafts completed."


def test_an_empty_task_stopped_says_so():
    assert _stop(make_task()) == "Stop requested; nothing was left to stop."


def test_completed_work_is_never_called_cancelled():
    task = make_task()
    make_item(task, state=S.COMPLETED, noun="summary", noun_plural="summaries")
    make_item(task, noun="draft")
    text = _stop(task)
    assert text == "Stopped new work. One draft discarded. One summary completed."
    assert "cancel" not in text.lower()


def test_uncertain_items_ask_for_review():
    task = make_task()
    make_item(task, state=S.UNCERTAIN, noun="export", kind=Kind.REMOTE_TOOL)
    make_item(task, state=S.UNCERTAIN, noun="export", kind=Kind.REMOTE_TOOL)
    assert _stop(task) == "Stopped new work. Two exports with unknown outcome; review required."


def test_sent_emails_cannot_be_recalled():
    task = make_task()
    make_external_effect(task, noun="email", system="mail", effect="sent", reversible=False)
    make_external_effect(task, noun="email", system="mail", effect="sent", reversible=False)
    make_item(task, noun="draft")
    assert _stop(task) == "Stopped new work. One draft discarded. Two emails sent; they cannot be recalled."


def test_a_mixed_task_tells_each_group_in_order():
    task = make_task()
    for _ in range(3):
        make_item(task, noun="draft")
    make_item(task, noun="export", kind=Kind.LOCAL_WORKER)
    make_item(task, state=S.COMPLETED, noun="draft")
    make_item(task, state=S.FAILED, noun="lookup")
    make_item(task, state=S.RUNNING, noun="report", kind=Kind.LOCAL_WORKER)
    make_external_effect(task, noun="email", system="mail", effect="sent", reversible=False)
    assert _stop(task) == (
        "Stopped new work. Three drafts discarded. One export cancelled before it started. "
        "One email sent; it cannot be recalled. One draft completed. One lookup failed. "
        "One report still being checked."
    )


def test_a_running_task_counts_progress():
    task = make_task()
    make_item(task, state=S.COMPLETED)
    make_item(task, state=S.RUNNING)
    make_item(task)
    assert task_summary(task) == "Running: one of three items finished. One draft completed."


def test_large_counts_use_digits_and_plural_rules():
    task = make_task()
    for _ in range(13):
        make_item(task, noun="query")
    assert _stop(task) == "Stopped new work. 13 queries discarded."


# The latest known outcome, through the services as it really happens.


def test_a_draft_cancelled_then_reported_completed_counts_as_completed_with_review():
    from stopdesk.services.items import item_finish

    task = make_task()
    flipped = make_item(task, noun="draft")
    make_item(task, noun="draft")
    _stop(task)
    item_finish(item_id=flipped.pk, succeeded=True, actor="test:openai")  # the response flipped
    text = task_summary(task)
    assert text == (
        "Stopped new work. One draft completed; a late report contradicts its record: review required. "
        "One draft discarded."
    )


def test_fifty_jobs_that_never_started_were_cancelled_before_they_started():
    task = make_task()
    for _ in range(50):
        make_item(task, noun="job", kind=Kind.LOCAL_WORKER)
    assert _stop(task) == "Stopped new work. 50 jobs cancelled before they started."


def test_a_stop_that_reconciled_an_in_flight_action_never_says_nothing_was_left():
    from stopdesk.services.items import item_attach_record, item_finish, item_register
    from stopdesk.services.transitions import item_submit

    task = make_task()
    item = item_register(task=task, kind=Kind.EXTERNAL_OPERATION, noun="record", actor="test", mechanism="http")
    item_submit(item_id=item.pk, idempotency_key="k-1", actor="test")
    _stop(task)
    # The reconciler looks the action up and finds it completed, with the record it created.
    item_attach_record(item_id=item.pk, system="crm", record_id="r-1", effect="created", actor="t", reversible=True)
    item_finish(item_id=item.pk, succeeded=True, actor="system:reconciler")
    text = task_summary(task)
    assert text == "Stopped new work. One record created; review required."
    assert "nothing was left" not in text


def test_a_started_worker_cancelled_by_stop_stopped_before_it_finished():
    from tests.web.scenes import settle

    task = make_task()
    worker = make_item(task, state=S.RUNNING, noun="export", kind=Kind.LOCAL_WORKER)
    _stop(task)
    settle(worker.pk, S.CANCELLED)
    assert task_summary(task) == "Stopped new work. One export stopped before it finished."


def test_a_draft_refused_at_the_boundary_whose_answer_was_used_is_work_stop_met():
    # The answer came back before Stop was known to the agent, which used it; the draft's record,
    # written after Stop committed, was refused. The ledger keeps the completion as a late result.
    task = make_task()
    task_request_stop(task_id=task.pk, actor="test", dispatch=lambda ids: None)
    draft = item_register(task=task.pk, actor="agent", kind=Kind.MODEL_REQUEST, noun="draft", mechanism="manual")
    assert draft.state == S.CANCELLED
    item_finish(item_id=draft.pk, succeeded=True, actor="agent", outcome="the agent used the answer")
    task.refresh_from_db()

    assert task_summary(task) == (
        "Stopped new work. One draft completed; a late report contradicts its record: review required."
    )


def test_tools_that_run_on_after_stop_are_told_still_running_never_stopped():
    task = make_task()
    exports = [make_item(task, state=S.RUNNING, noun="export", kind=Kind.LOCAL_WORKER) for _ in range(2)]
    make_item(task, state=S.RUNNING, noun="report", kind=Kind.LOCAL_WORKER)
    for export in exports:
        note = {"uninterruptible": "cannot be interrupted; waiting for it to finish"}
        item_note_evidence(item_id=export.pk, evidence=note, actor="agent", message="export: cannot be interrupted")

    assert _stop(task) == (
        "Stopped new work. Two exports still running: they cannot be interrupted; waiting for them to finish. "
        "One report still being checked."
    )
    item_finish(item_id=exports[0].pk, succeeded=True, actor="agent", outcome="exported Acme")
    assert task_summary(task) == (
        "Stopped new work. One export completed. "
        "One export still running: it cannot be interrupted; waiting for it to finish. One report still being checked."
    )
