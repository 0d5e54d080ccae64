"""Reconcile's lookups on a person's behalf: the object, or 404, after the permission check
(the ledger's own are in `stopdesk.permissions`)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from reconcile.models import Compensation, Escalation
from stopdesk.permissions import REVIEW_ANY, check
from stopdesk.states import CompensationState


def compensation_for(user: Any, pk: int) -> Compensation:
    check(user, *REVIEW_ANY)
    return get_object_or_404(
        Compensation.objects.select_related("external_record__item__task", "proposed_by", "approved_by"), pk=pk
    )


OPEN_COMPENSATION_STATES = (
    CompensationState.PROPOSED,
    CompensationState.APPROVED,
    CompensationState.RUNNING,
    CompensationState.ESCALATED,
)


def tasks_with_open_work() -> QuerySet[Any, int]:
    """The ledger's `tasks_with_open_work` port: ids of the tasks with a compensation under way or
    an open escalation (an archived month must keep their events)."""
    compensations = Compensation.objects.filter(state__in=OPEN_COMPENSATION_STATES).values_list(
        "external_record__item__task_id", flat=True
    )
    escalations = Escalation.objects.filter(closed_at__isnull=True, item__isnull=False).values_list(
        "item__task_id", flat=True
    )
    return compensations.union(escalations)
