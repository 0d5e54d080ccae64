"""The tool readiness page: each tool's verdict, with its capabilities and its latest drill."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from reconcile import readiness
from reconcile.models import DrillRun
from stopdesk import permissions as perms

PILL = {
    readiness.READY: "completed",
    readiness.LIMITED: "awaiting_reconciliation",
    readiness.UNTESTED: "queued",
    readiness.NOT_READY: "failed",
}


@perms.require(perms.VIEW)
def readiness_page(request: HttpRequest) -> HttpResponse:
    verdicts = readiness.verdicts()
    for verdict in verdicts:
        verdict.pill = PILL[verdict.status]  # type: ignore[attr-defined]
        verdict.label = verdict.status.replace("_", " ").capitalize()  # type: ignore[attr-defined]
    latest = DrillRun.objects.order_by("-pk").first()
    context = {
        "verdicts": verdicts,
        # Framework tools whose work a Stop could leave unaccounted for: the cue to narrow the tool set.
        "narrow": [v for v in verdicts if v.framework and v.status == readiness.NOT_READY],
        "policy": readiness.policy(),
        "latest_run": latest,
        "latest_rows": latest.rows.order_by("mechanism", "id") if latest else [],
    }
    return render(request, "readiness.html", context)
