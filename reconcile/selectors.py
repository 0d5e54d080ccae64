"""Reconcile's lookups on a person's behalf: the object, or 404, after the permission check
(the ledger's own are in `stopdesk.permissions`)."""

from __future__ import annotations

from typing import Any

from django.shortcuts import get_object_or_404

from reconcile.models import Compensation
from stopdesk.permissions import REVIEW_ANY, check


def compensation_for(user: Any, pk: int) -> Compensation:
    check(user, *REVIEW_ANY)
    return get_object_or_404(
        Compensation.objects.select_related("external_record__item__task", "proposed_by", "approved_by"), pk=pk
    )
