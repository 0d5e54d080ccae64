"""What watching a cancelled draft costs the provider: read-backs of one cancelled OpenAI
background response over five minutes after Stop, with the adapter's default settings, counted by
the Responses stand-in itself. The clock is controllable: every second of the five minutes is
swept (as a beat-driven sweep would), without sleeping."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reconcile.mechanisms.openai.agent import response_create
from reconcile.mechanisms.registry import mechanism_settings
from reconcile.services.cancel import item_cancel
from reconcile.services.reconcile import sweep_once
from stopdesk.services.items import item_register
from stopdesk.states import ItemState, Kind
from tests.factories import make_task
from tests.reconcile.helpers import stop

S = ItemState
pytestmark = pytest.mark.django_db
WATCHED_S = 300


def test_one_cancelled_draft_is_read_back_a_handful_of_times_in_five_minutes(
    openai_party, django_capture_on_commit_callbacks, clock, settings
):
    party, url = openai_party
    # The adapter's own default timings; the endpoint is the stand-in, as configured.
    settings.STOPDESK_MECHANISMS = {"openai": {"options": {"base_url": url}}}
    assert mechanism_settings("openai").recheck_after_cancelled_s >= WATCHED_S
    task = make_task()
    item = item_register(task=task, kind=Kind.MODEL_REQUEST, noun="draft", actor="test", mechanism="openai")
    response = response_create(item_id=item.pk, actor="test", base_url=url, model="gpt-test", input="Draft it")
    stop(task, django_capture_on_commit_callbacks)
    item_cancel(item_id=item.pk)
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.next_check_at is not None
    before = party.counts.count("retrieve", response.id)

    end = clock.now + timedelta(seconds=WATCHED_S)
    while clock.now < end:
        clock.advance(1)
        sweep_once(now=clock.now, concurrency=1)
    reads = party.counts.count("retrieve", response.id) - before
    print(f"\nread-backs of one cancelled draft over {WATCHED_S} s: {reads}")
    # 5 s, 20 s, 65 s and 200 s after the cancel (the next is at 600 s, the window's end).
    assert reads == 4
    item.refresh_from_db()
    assert item.state == S.CANCELLED and item.next_check_at is not None  # still watched
