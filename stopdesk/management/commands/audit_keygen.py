"""Generate the Ed25519 key that signs the audit chain's heads."""

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from stopdesk.audit_sign import key_generate_pem, key_parse, key_write


class Command(BaseCommand):
    help = (
        "Write a new Ed25519 private key (PEM, mode 0600) to FILE and print its public key and id. Point "
        "STOPDESK_AUDIT_SIGNING_KEY_FILE at it; keep it where the database's owner cannot read it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="Where to write the key (must not exist).")

    def handle(self, *args: Any, **options: Any) -> None:
        path: Path = options["file"]
        pem = key_generate_pem()
        try:
            key_write(path, pem)
        except FileExistsError:
            raise CommandError(f"{path}: exists; a key is never overwritten (the anchors it signed need it)") from None
        except OSError as error:
            raise CommandError(f"{path}: {error.strerror}") from None
        key = key_parse(pem, source=str(path))
        self.stdout.write(f"audit_keygen: wrote {path} ({key.key_id}); public key {key.public_b64}")
