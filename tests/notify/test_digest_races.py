"""Facts filed while digests are written, on PostgreSQL with threads of their own connections:
each fact is counted in exactly one message, whether its digest stays open or is closed and a
new one opened under it."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.db.models import F
from django.utils import timezone

from stopdesk.notify.digest import digests_send
from stopdesk.notify.models import Digest, Notification
from stopdesk.notify.topics import Topic
from stopdesk.services.transitions import item_transition
from stopdesk.states import ItemState
from tests.factories import ACTOR, make_item, make_task

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]

WRITERS = 4
PER_WRITER = 30


def test_facts_filed_while_digests_are_written_are_each_counted_once(settings):
    # Every sweep writes what it has; the task flips between settled and not (a just-in-time
    # agent), so digests close and new ones open while facts are being filed.
    settings.STOPDESK_NOTIFY = {**settings.STOPDESK_NOTIFY, "DIGEST_WINDOW_SECONDS": 0, "DIGEST_REPEAT_MINUTES": 0}
    task = make_task("Update vendors")
    writing = threading.Barrier(WRITERS + 2)  # the writers, the sweeper and this thread
    done = threading.Event()
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            writing.wait()
            for _ in range(PER_WRITER):
                item = make_item(task, state=ItemState.RUNNING)
                item_transition(item_id=item.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR)
        except BaseException as exc:  # reported below; a thread's exception is otherwise lost
            failures.append(exc)
        finally:
            connections.close_all()

    start = timezone.now()
    sweeps = itertools.count(1)

    def sweeper() -> None:
        try:
            writing.wait()
            while not done.is_set():
                # Each pass a minute later than the last, so every open digest is due again.
                digests_send(now=start + timedelta(minutes=next(sweeps)))
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=writer) for _ in range(WRITERS)]
    sweeping = threading.Thread(target=sweeper)
    for t in threads:
        t.start()
    sweeping.start()
    writing.wait()
    for t in threads:
        t.join()
    done.set()
    sweeping.join()
    assert failures == []
    digests_send(now=start + timedelta(minutes=next(sweeps)))  # the last facts, and the task has settled

    facts = Notification.objects.filter(topic=Topic.ITEM_UNCERTAIN)
    assert facts.count() == WRITERS * PER_WRITER
    assert not facts.filter(digest__isnull=True).exists()
    assert not facts.filter(id__gt=F("digest__counted_through")).exists()  # every fact was counted
    assert not Digest.objects.filter(closed_at__isnull=True).exists()
    messages = list(Notification.objects.filter(topic=Topic.TASK_DIGEST).order_by("id"))
    counted = sum(m.data["new"].get(Topic.ITEM_UNCERTAIN, 0) for m in messages)
    assert counted == WRITERS * PER_WRITER  # ... and none twice
    for digest in Digest.objects.all():
        own = [m for m in messages if m.data["digest_id"] == digest.pk]
        assert sum(m.data["new"][Topic.ITEM_UNCERTAIN] for m in own) == own[-1].data["total"][Topic.ITEM_UNCERTAIN]
        assert own[-1].data["total"][Topic.ITEM_UNCERTAIN] == digest.facts.count()
    assert Digest.objects.count() > 1  # the race was run: digests closed while facts kept coming


def test_a_digest_whose_facts_are_still_being_filed_is_left_to_the_next_sweep(settings):
    from django.db import transaction

    settings.STOPDESK_NOTIFY = {**settings.STOPDESK_NOTIFY, "DIGEST_WINDOW_SECONDS": 0}
    task = make_task("Update vendors")
    first, second = make_item(task, state=ItemState.RUNNING), make_item(task, state=ItemState.RUNNING)
    item_transition(item_id=first.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR)
    filed, release = threading.Event(), threading.Event()

    def slow_writer() -> None:
        try:
            with transaction.atomic():  # files a fact, then holds its transaction open
                item_transition(item_id=second.pk, to_state=ItemState.UNCERTAIN, actor=ACTOR)
                filed.set()
                release.wait(30)
        finally:
            connections.close_all()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert filed.wait(10)
    later = timezone.now() + timedelta(minutes=1)
    assert digests_send(now=later) == 0  # waited its bounded time, wrote nothing, raised nothing
    release.set()
    writer.join()
    assert digests_send(now=later) == 1
    (message,) = Notification.objects.filter(topic=Topic.TASK_DIGEST)
    assert message.data["total"] == {Topic.ITEM_UNCERTAIN: 2} and message.data["settled"]
