"""Move a past month of audit events out of the database, keeping every chain verifiable."""

from datetime import date
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from stopdesk.services.partitions import ArchiveRefused, event_partitions, events_archive


class Command(BaseCommand):
    help = (
        "List the audit table's monthly partitions, or archive one past month: export it (gzip CSV "
        "with every hash, plus a manifest of each task's chain anchor), then drop it. Refuses while "
        "any task with events in that month is under review or has a compensation under way."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--month", help="YYYY-MM: the month to archive. Without it, list the partitions.")
        parser.add_argument("--to", type=Path, help="Folder for the export and its manifest.")

    def handle(self, *args: Any, **options: Any) -> None:
        if not options["month"]:
            for part in event_partitions():
                label = f"{part.month:%Y-%m}" if part.month else "default (outside every month)"
                self.stdout.write(f"{part.name}  {label}  ~{part.rows:,} events")
            return
        if options["to"] is None:
            raise CommandError("--to FOLDER is required with --month")
        try:
            year, month = (int(part) for part in options["month"].split("-"))
            first = date(year, month, 1)
        except ValueError as error:
            raise CommandError(f"--month {options['month']!r} is not YYYY-MM") from error
        try:
            done = events_archive(month=first, out_dir=options["to"], today=timezone.now().date())
        except ArchiveRefused as refused:
            raise CommandError(f"refused: {refused}") from refused
        self.stdout.write(
            f"archived {done.partition}: {done.rows:,} events to {done.path} (sha256 {done.sha256}); "
            f"{done.anchors:,} chain anchors kept"
        )
