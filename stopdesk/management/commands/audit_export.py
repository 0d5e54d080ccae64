"""Write a signed, self-describing export of the audit chains, to be checked offline."""

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stopdesk.services.audit_export import audit_export


class Command(BaseCommand):
    help = (
        "Seal what has committed, then write every chain to FILE as JSON Lines signed with the audit key "
        "(never overwrites). Check it with `audit_verify --export FILE --anchors DIR`, no database needed."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="The export to write (must not exist).")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        if path.exists():
            raise CommandError(f"{path}: exists; an export is never overwritten")
        if not path.parent.is_dir():
            raise CommandError(f"{path.parent}: no such directory")
        done = audit_export(path)
        self.stdout.write(
            f"audit_export: {done.events} events in {done.chains} chains written to {path}, signed by {done.key_id};"
            f" {done.unsealed_left_out} events committed since the seal are not in it."
        )
