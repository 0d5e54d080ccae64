import pytest

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
    assert _stop(task) == "Stopped new work. Two drafts discarded. One record created; review required."


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
        "Stopped new work. Three drafts discarded. One export stopped before it finished. "
        "One email sent; it cannot be recalled. One draft completed. One lookup failed. "
        "One report still being checked."
    )


def test_a_running_task_counts_progress():
    task = make_task()
    make_item(task, state=S.COMPLETED)
    make_item(task, state=S.RUNNING)
    make_item(task)
    assert task_summary(task) == "Running: 1 of 3 items finished. One draft completed."


def test_large_counts_use_digits_and_plural_rules():
    task = make_task()
    for _ in range(13):
        make_item(task, noun="query")
    assert _stop(task) == "Stopped new work. 13 queries discarded."
