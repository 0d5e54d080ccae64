"""Starting a demo task: the task and its agent-run item are recorded first, then the agent is
queued after commit (`stopdesk.agent.workers.dispatch`)."""

from __future__ import annotations

import time
from typing import Any

from django.contrib.auth import get_user_model

from stopdesk.agent.workers import dispatch
from stopdesk.models import Task, WorkItem
from stopdesk.services.items import task_create
from stopdesk.states import ItemState
from stopdrill.demo.agent import STAGES, invoice_analysis

TITLE = "Invoice analysis: ACME batch 42"
ACTOR = "demo"


def demo_task_start(*, stage: str = "", pace: float = 15.0, owner: Any = None, title: str = TITLE) -> Task:
    """Record a new demo task and queue its agent. `stage` fast-forwards through the stages up to
    and including it; the rest run `pace` seconds apart."""
    if stage and stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
    if owner is None:
        owner = get_user_model().objects.filter(is_superuser=True).order_by("pk").first()
    task = task_create(title=title, actor=ACTOR, owner=owner)
    dispatch(
        invoice_analysis,
        task=task,
        noun="agent run",
        actor=ACTOR,
        label="Invoice analysis agent",
        kwargs={"stopdesk_task_id": task.pk, "fast_until": stage, "pace": pace},
    )
    return task


def stage_reached(task: Task, stage: str) -> bool:
    """Whether the agent has got as far as `stage` (or the task was stopped, which ends it)."""
    items = WorkItem.objects.filter(task=task)
    if Task.objects.filter(pk=task.pk, stop_requested_at__isnull=False).exists():
        return True
    done = ItemState.COMPLETED
    if stage == "drafts":
        return items.filter(noun="draft").exclude(handle="").count() >= 2
    if stage == "tools":
        return items.filter(noun="lookup").exclude(state=ItemState.QUEUED).exists()
    if stage in ("record", "email"):
        return items.filter(noun=stage, state=done).exists()
    return items.filter(noun="agent run", state__in=(done, ItemState.FAILED, ItemState.CANCELLED)).exists()


def demo_task_wait(task: Task, stage: str, *, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if stage_reached(task, stage):
            return True
        time.sleep(0.25)
    return False
