"""Every periodic job in the beat schedule exists, has limits Celery accepts, and runs."""

import pytest
from django.conf import settings

from stopdesk.celery import app


@pytest.mark.parametrize("entry", sorted(settings.CELERY_BEAT_SCHEDULE))
def test_each_beat_entry_names_a_task_with_consistent_time_limits(entry):
    app.loader.import_default_modules()
    task = app.tasks[settings.CELERY_BEAT_SCHEDULE[entry]["task"]]
    hard = task.time_limit or app.conf.task_time_limit
    soft = task.soft_time_limit or app.conf.task_soft_time_limit
    # Celery refuses to schedule a task whose soft limit exceeds its hard limit.
    assert soft is None or hard is None or soft <= hard, f"{entry}: soft {soft} > hard {hard}"


@pytest.mark.django_db
@pytest.mark.parametrize("entry", sorted(settings.CELERY_BEAT_SCHEDULE))
def test_each_beat_entry_runs_on_an_empty_ledger(entry):
    app.loader.import_default_modules()
    result = app.tasks[settings.CELERY_BEAT_SCHEDULE[entry]["task"]].apply()
    assert result.successful(), result.traceback


@pytest.mark.django_db
def test_stored_api_replays_older_than_a_week_are_purged_and_newer_ones_kept():
    from datetime import timedelta

    from django.utils import timezone

    from stopdesk.models import ApiIdempotency, Runtime
    from stopdesk.services.reaper import api_replays_purge

    runtime = Runtime(name="r")
    runtime.issue_token()
    runtime.save()
    old = ApiIdempotency.objects.create(runtime=runtime, key="old", endpoint="start:1", status=200, body={})
    new = ApiIdempotency.objects.create(runtime=runtime, key="new", endpoint="start:2", status=200, body={})
    ApiIdempotency.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=8))
    assert api_replays_purge() == 1
    assert list(ApiIdempotency.objects.values_list("pk", flat=True)) == [new.pk]
