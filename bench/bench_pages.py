"""The dashboard's two heavy pages on PostgreSQL.

page.task_ms / page.task_queries    the task page for a task with 10,000 children (and 100)
page.queue_ms / page.queue_queries  the review queue with 10,000 items in it (and 100)

Server time is the request through Django's full stack in-process (middleware, view, template),
the median of several warm runs; the network is not in it. The query count must be the same at
both sizes.
"""

from __future__ import annotations

from datetime import timedelta

from bench.harness import Figure, page_timing


def _seed_task(n: int):  # type: ignore[no-untyped-def]
    """One task with n children across every state. Seeding writes rows directly: set-up, not a
    state change."""
    from django.utils import timezone

    from stopdesk.models import CancellationAttempt, ExternalRecord, StopRequest, Task, WorkItem
    from stopdesk.states import ItemState as S
    from stopdesk.states import Kind

    now = timezone.now()
    task = Task.objects.create(title=f"bench task {n}", stop_requested_at=now)
    StopRequest.objects.create(task=task, requested_at=now, actor="bench")
    mix = [
        (S.QUEUED, 0.3),
        (S.RUNNING, 0.2),
        (S.AWAITING_RECONCILIATION, 0.1),
        (S.UNCERTAIN, 0.1),
        (S.COMPLETED, 0.15),
        (S.FAILED, 0.05),
        (S.CANCELLED, 0.1),
    ]
    rows = []
    for state, share in mix:
        for _ in range(int(n * share)):
            rows.append(
                WorkItem(
                    task=task,
                    kind=Kind.EXTERNAL_OPERATION,
                    noun="record",
                    mechanism="http",
                    handle="h",
                    state=state,
                    investigate_by=now + timedelta(hours=4) if state == S.UNCERTAIN else None,
                )
            )
    items = WorkItem.objects.bulk_create(rows, batch_size=2000)
    completed = [i for i in items if i.state == S.COMPLETED]
    ExternalRecord.objects.bulk_create(
        [
            ExternalRecord(
                item=i,
                system="crm",
                record_id=f"t{n}-{i.pk}",
                version="1",
                effect="created",
                reversible=True,
                reversal="archive",
            )
            for i in completed
        ],
        batch_size=2000,
    )
    CancellationAttempt.objects.bulk_create(
        [
            CancellationAttempt(
                item=i, mechanism="http", action="cancel", answered_at=now, ok=False, observed_status="running"
            )
            for i in items
            if i.state in (S.RUNNING, S.AWAITING_RECONCILIATION)
        ],
        batch_size=2000,
    )
    return task


def _seed_queue(n: int, reviewer) -> None:  # type: ignore[no-untyped-def]
    """n items waiting for review: 60% uncertain, 20% completed effects, 20% proposals."""
    from django.utils import timezone

    from reconcile.models import Compensation, Escalation
    from stopdesk.models import ExternalRecord, Task, WorkItem
    from stopdesk.states import ItemState as S
    from stopdesk.states import Kind

    now = timezone.now()
    task = Task.objects.create(title=f"bench queue {n}", stop_requested_at=now)
    uncertain = WorkItem.objects.bulk_create(
        [
            WorkItem(
                task=task,
                kind=Kind.REMOTE_TOOL,
                noun="upload",
                mechanism="mcp",
                state=S.UNCERTAIN,
                investigate_by=now + timedelta(minutes=k - n // 3),
            )
            for k in range(int(n * 0.6))
        ],
        batch_size=2000,
    )
    effects = WorkItem.objects.bulk_create(
        [
            WorkItem(task=task, kind=Kind.EXTERNAL_OPERATION, noun="record", mechanism="http", state=S.COMPLETED)
            for _ in range(int(n * 0.4))
        ],
        batch_size=2000,
    )
    records = ExternalRecord.objects.bulk_create(
        [
            ExternalRecord(
                item=i,
                system="crm",
                record_id=f"q{n}-{i.pk}",
                version="1",
                effect="created",
                reversible=True,
                reversal="archive",
            )
            for i in effects
        ],
        batch_size=2000,
    )
    Compensation.objects.bulk_create(
        [
            Compensation(external_record=r, action="archive", expected_version="1", proposed_by=reviewer)
            for r in records[: len(records) // 2]
        ],
        batch_size=2000,
    )
    Escalation.objects.bulk_create(
        [Escalation(item=i, to=reviewer, by=reviewer, reason="bench") for i in uncertain[: max(1, n // 100)]]
    )


def run() -> list[Figure]:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.test import Client

    from stopdesk.permissions import roles_ensure

    roles_ensure()
    users = get_user_model()
    operator = users.objects.create_user("bench-operator")
    operator.groups.add(Group.objects.get(name="operators"))
    reviewer = users.objects.create_user("bench-reviewer")
    reviewer.groups.add(Group.objects.get(name="reviewers"))
    as_operator, as_reviewer = Client(), Client()
    as_operator.force_login(operator)
    as_reviewer.force_login(reviewer)

    figures = []
    results = {}
    for n in (100, 10_000):
        task = _seed_task(n)
        results[("task", n)] = page_timing(as_operator, f"/tasks/{task.pk}/")
    from reconcile.models import Compensation, Escalation
    from stopdesk.models import ExternalRecord, WorkItem

    for n in (100, 10_000):
        # Each size alone in the queue: clear the previous size's rows (bench data, set-up only).
        Escalation.objects.all().delete()
        Compensation.objects.all().delete()
        WorkItem.objects.filter(task__title__startswith="bench task").update(state="cancelled")
        ExternalRecord.objects.filter(item__task__title__startswith="bench queue").delete()
        WorkItem.objects.filter(task__title__startswith="bench queue").update(state="cancelled")
        _seed_queue(n, reviewer)
        results[("queue", n)] = page_timing(as_reviewer, "/queue/")

    for page in ("task", "queue"):
        for n in (100, 10_000):
            ms, queries = results[(page, n)]
            suffix = "" if n == 10_000 else "_at_100"
            figures.append(Figure(f"page.{page}_ms{suffix}", ms, "ms", 150.0 if n == 10_000 else None))
            figures.append(
                Figure(
                    f"page.{page}_queries{suffix}", queries, "queries", results[(page, 100)][1] if n == 10_000 else None
                )
            )
    return figures
