"""Recompute the audit trail's hash chains and name the first broken link of each."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stopdesk.services.audit import audit_verify


class Command(BaseCommand):
    help = "Check every event against its task's hash chain; exit 1 and name the first broken link of each chain."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", type=int, help="Check one task's chain only.")

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit_verify(task_id=options["task"])
        breaks = report.breaks or []
        for found in breaks:
            self.stderr.write(f"broken: {found}")
        summary = f"audit_verify: {report.events} events in {report.chains} chains checked, {len(breaks)} broken."
        if breaks:
            raise CommandError(summary)
        self.stdout.write(summary)
