"""Start a new demo task: `manage.py demo_task [--stage drafts|tools|record|email|done] [--wait]`.

The agent runs in the Celery worker that `manage.py up` started, against the sandbox.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from stopdesk.config import require_migrated_database
from stopdrill.demo.agent import STAGES
from stopdrill.demo.start import demo_task_start, demo_task_wait
from stopdrill.launcher import web_url


class Command(BaseCommand):
    help = "Start a demo agent task (invoice analysis): drafts, an MCP lookup, a CRM record, an email."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--stage",
            choices=STAGES,
            default="",
            help="Fast-forward through the stages up to and including this one; the rest run paced.",
        )
        parser.add_argument("--pace", type=float, default=15.0, help="Seconds between the paced stages (default 15).")
        parser.add_argument(
            "--wait",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="Wait up to this long for the stage to be reached.",
        )

    def handle(self, *args: Any, stage: str = "", pace: float = 15.0, wait: float = 0.0, **options: Any) -> None:
        require_migrated_database()
        if pace < 0:
            raise CommandError("--pace must be zero or more seconds.")
        task = demo_task_start(stage=stage, pace=pace)
        self.stdout.write(f"demo task {task.pk} started: {web_url()}/tasks/{task.pk}/")
        if wait and stage:
            if not demo_task_wait(task, stage, timeout_s=wait):
                raise CommandError(
                    f"task {task.pk} did not reach stage {stage!r} within {wait:.0f}s; is the worker running?"
                )
            self.stdout.write(f"demo task {task.pk} reached stage {stage}")
