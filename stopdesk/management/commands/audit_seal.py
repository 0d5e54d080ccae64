"""Seal the audit events that have committed since the last seal (the beat job does this too)."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stopdesk.services.audit_seal import audit_seal, audit_unsealed


class Command(BaseCommand):
    help = (
        "Give every committed, unsealed audit event its place and hash in its task's chain, in batches. "
        "Waits for a sealer already running, then carries on after it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--batch", type=int, default=5000, help="Events per transaction (default 5000).")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch"] < 1:
            raise CommandError(f"--batch {options['batch']}: must be at least 1")
        sealed = audit_seal(batch=options["batch"], wait=True) or 0
        left = audit_unsealed()
        self.stdout.write(f"audit_seal: sealed {sealed} events; {left.events} not sealed yet (committed since).")
