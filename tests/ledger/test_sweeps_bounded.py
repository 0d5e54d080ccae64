"""Each sweep moves a bounded batch per run, so a backlog drains in steps instead of one
statement over everything (the figures at scale are in bench/bench_scale.py)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from reconcile.services.reconcile import items_flag_overdue
from stopdesk.models import Event, WorkItem
from stopdesk.services.reaper import items_reap_stale
from stopdesk.states import ItemState as S
from tests.factories import make_item, make_task

pytestmark = pytest.mark.django_db


def test_the_reaper_takes_a_bounded_batch_the_longest_expired_first():
    task = make_task()
    items = [make_item(task, state=S.RUNNING) for _ in range(3)]
    now = timezone.now()
    for minutes, item in zip((1, 3, 2), items, strict=True):
        # Time passing: each lease ran out some minutes ago.
        WorkItem.objects.filter(pk=item.pk).update(lease_until=now - timedelta(minutes=minutes))
    assert items_reap_stale(limit=2) == 2
    moved = set(WorkItem.objects.filter(state=S.AWAITING_RECONCILIATION).values_list("id", flat=True))
    assert moved == {items[1].pk, items[2].pk}
    assert items_reap_stale(limit=2) == 1
    assert items_reap_stale(limit=2) == 0
    assert Event.objects.filter(kind="lease_expired").count() == 3


def test_overdue_flagging_takes_a_bounded_batch_and_never_flags_twice():
    task = make_task()
    items = [make_item(task, state=S.UNCERTAIN) for _ in range(3)]
    now = timezone.now()
    WorkItem.objects.filter(pk__in=[i.pk for i in items]).update(investigate_by=now - timedelta(hours=1))
    assert items_flag_overdue(now=now, limit=2) == 2
    assert items_flag_overdue(now=now, limit=2) == 1
    assert items_flag_overdue(now=now, limit=2) == 0
    assert WorkItem.objects.filter(needs_review=True).count() == 3
    assert Event.objects.filter(kind="investigation_overdue").count() == 3
