"""Seal what has committed, recompute the audit trail's hash chains and name the first broken link
of each; report the events still waiting to be sealed apart."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from stopdesk.services.audit import audit_verify


class Command(BaseCommand):
    help = "Check every event against its task's hash chain; exit 1 and name the first broken link of each chain."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", type=int, help="Check one task's chain only.")
        parser.add_argument(
            "--no-seal", action="store_true", help="Check as the chains stand; do not seal committed events first."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = audit_verify(task_id=options["task"], seal=not options["no_seal"])
        breaks = report.breaks or []
        for found in breaks:
            self.stderr.write(f"broken: {found}")
        summary = (
            f"audit_verify: sealed {report.sealed_now} new events; {report.events} events in {report.chains} chains"
            f" checked, {len(breaks)} broken."
        )
        if report.unsealed:
            age = (timezone.now() - report.oldest_unsealed).total_seconds() if report.oldest_unsealed else 0.0
            summary += f" Not sealed yet: {report.unsealed} events, the oldest written {age:.0f} s ago."
        else:
            summary += " Not sealed yet: none."
        if breaks:
            raise CommandError(summary)
        self.stdout.write(summary)
