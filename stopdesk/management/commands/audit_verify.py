"""Seal what has committed, recompute the audit trail's hash chains and name the first broken link
of each; report the events still waiting to be sealed apart. With --anchors, also compare each
chain with the newest head signed for it outside the database; with --export, check a signed
export offline, without the database."""

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from stopdesk.audit_offline import export_verify
from stopdesk.audit_sign import Anchored, SigningKeyError, anchors_read, public_key_parse
from stopdesk.services.audit import Report, audit_verify


class Command(BaseCommand):
    help = "Check every event against its task's hash chain; exit 1 and name the first broken link of each chain."
    # --export needs no database: Django's checks would open a connection.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--task", type=int, help="Check one task's chain only.")
        parser.add_argument(
            "--no-seal", action="store_true", help="Check as the chains stand; do not seal committed events first."
        )
        parser.add_argument(
            "--anchors",
            type=Path,
            help="A directory of signed chain heads (anchors-*.jsonl) to check the chains against.",
        )
        parser.add_argument(
            "--export", type=Path, help="Check this signed export (manage.py audit_export) instead of the database."
        )
        parser.add_argument(
            "--public-key", type=Path, help="Trust only this key (a PEM or base64 public key, or the private key file)."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        trusted = _trusted_key(options["public_key"])
        if options["export"] is not None:
            self._export(options["export"], options["anchors"], trusted)
            return
        anchored = anchors_read(options["anchors"], trusted_key=trusted) if options["anchors"] else None
        report = audit_verify(task_id=options["task"], seal=not options["no_seal"], anchored=anchored)
        self._database(report, anchored)

    def _database(self, report: Report, anchored: Anchored | None) -> None:
        breaks = report.breaks or []
        problems = (anchored.problems or []) if anchored is not None else []
        for found in breaks:
            self.stderr.write(f"broken: {found}")
        for problem in problems:
            self.stderr.write(f"anchors: {problem}")
        summary = (
            f"audit_verify: sealed {report.sealed_now} new events; {report.events} events in {report.chains} chains"
            f" checked, {len(breaks)} broken."
        )
        if anchored is not None:
            summary += _anchor_words(anchored, report.anchored_chains)
        if report.unsealed:
            age = (timezone.now() - report.oldest_unsealed).total_seconds() if report.oldest_unsealed else 0.0
            summary += f" Not sealed yet: {report.unsealed} events, the oldest written {age:.0f} s ago."
        else:
            summary += " Not sealed yet: none."
        if breaks or problems:
            raise CommandError(summary)
        self.stdout.write(summary)

    def _export(self, path: Path, anchors: Path | None, trusted: str | None) -> None:
        report = export_verify(path, anchors, trusted_key=trusted)
        for found in report.breaks:
            self.stderr.write(f"broken: {found}")
        for problem in report.problems:
            self.stderr.write(f"export: {problem}")
        summary = (
            f"audit_verify: export {path} signed by {report.key_id or 'nobody'}: {report.events} events in"
            f" {report.chains} chains checked, {len(report.breaks)} broken."
        )
        if anchors is None:
            summary += " No anchors given: a chain rewritten in full with its head would pass."
        else:
            summary += f" {report.anchored_chains} chains compared with {report.anchor_lines} signed anchors."
        if report.breaks or report.problems:
            raise CommandError(summary)
        self.stdout.write(summary)


def _trusted_key(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return public_key_parse(path.read_text(), source=str(path))
    except OSError as error:
        raise CommandError(f"--public-key {path}: {error.strerror}") from None
    except SigningKeyError as error:
        raise CommandError(f"--public-key {error}") from None


def _anchor_words(anchored: Anchored, compared: int) -> str:
    keys = ", ".join(sorted(anchored.key_ids)) or "no key"
    return f" {compared} chains compared with {anchored.lines} signed anchors ({keys})."
