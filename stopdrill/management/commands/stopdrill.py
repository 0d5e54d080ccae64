"""Exercise the stop path before release: each drill against each configured mechanism.

    python manage.py stopdrill                       # every drill, every mechanism, on the sandbox
    python manage.py stopdrill --drill duplicate_stop --mechanism openai
    python manage.py stopdrill --write-reliability   # and write docs/RELIABILITY.md from this run
    python manage.py stopdrill --crm-url URL          # against your own CRM (reversible test records)
    python manage.py stopdrill --openai-api-key KEY [--openai-base-url URL] [--openai-model M]
    python manage.py stopdrill --mcp-url URL --mcp-tool NAME [--mcp-arguments JSON]   # read-only tool

With any of the integration options, the drills run against your systems instead of the sandbox:
only reversible or read-only test actions, no fault injection (those drills are not applicable),
and every CRM record a drill created is archived with If-Match at the end (the table lists them).

Prints the table (drill, mechanism, expected, observed, pass or fail, each item's final state),
stores the run (reconcile.DrillRun), and exits non-zero if any drill failed.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from stopdesk.config import require_migrated_database
from stopdrill.drills import reliability
from stopdrill.drills.catalogue import BY_NAME
from stopdrill.drills.external import Integration
from stopdrill.drills.runner import Outcome, run_drills
from stopdrill.drills.table import table

DEFAULT_MODEL = "gpt-4o-mini"


class Command(BaseCommand):
    help = "Run the stop drills against each mechanism on the sandbox and print what happened."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--drill", action="append", choices=sorted(BY_NAME), help="Only this drill (repeatable).")
        parser.add_argument("--mechanism", action="append", help="Only this mechanism (repeatable).")
        parser.add_argument("--no-store", action="store_true", help="Do not keep the run in the database.")
        parser.add_argument("--brief", action="store_true", help="Leave out the per-item lines.")
        parser.add_argument(
            "--write-reliability",
            nargs="?",
            const=str(Path(settings.BASE_DIR) / "docs" / "RELIABILITY.md"),
            metavar="PATH",
            help="Write docs/RELIABILITY.md (or PATH) from this run.",
        )
        parser.add_argument(
            "--fault-results",
            metavar="JUNIT_XML",
            help="A pytest --junitxml report of tests/faults, to show their results in RELIABILITY.md.",
        )
        own = parser.add_argument_group("your own integration (instead of the sandbox)")
        own.add_argument("--crm-url", help="An HTTP API with the sandbox CRM's contract; test records are archived.")
        own.add_argument("--openai-base-url", help="Responses API base URL (default: OpenAI's).")
        own.add_argument("--openai-api-key", help="API key for the Responses API (never written to any file).")
        own.add_argument("--openai-model", default=DEFAULT_MODEL, help="Model for the short test responses.")
        own.add_argument("--mcp-url", help="A streamable HTTP MCP server.")
        own.add_argument("--mcp-tool", help="A tool on it that is annotated read-only.")
        own.add_argument("--mcp-arguments", default="{}", help="JSON arguments for the tool call.")

    def handle(self, *args: Any, **options: Any) -> None:
        require_migrated_database()

        def progress(outcome: Outcome) -> None:
            self.stderr.write(f"  {outcome.verdict:4}  {outcome.drill} / {outcome.mechanism}  ({outcome.seconds}s)")

        # A parked `hang` request is cancelled when the sandbox stops; uvicorn logs that as an
        # error, which is the fault working as intended, not news.
        logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
        report = run_drills(
            drills=options["drill"],
            mechanisms=options["mechanism"],
            store=not options["no_store"],
            progress=progress,
            target=self._integration(options),
        )
        self.stdout.write(table(report, items=not options["brief"]))
        if report.run is not None:
            self.stdout.write(f"Stored as drill run #{report.run.pk}.")
        if options["write_reliability"]:
            # The environment that chose the database and broker is part of the command.
            env = [
                f"{name}={re.sub(r'://([^:@/]+):[^@/]*@', r'://\1:***@', os.environ[name])}"
                for name in ("DATABASE_URL", "CELERY_BROKER_URL")
                if os.environ.get(name)
            ]
            command = shlex.join([*env, "python", "manage.py", "stopdrill", *recorded_arguments(options)])
            faults = Path(options["fault_results"]) if options["fault_results"] else None
            path = reliability.write(report, Path(options["write_reliability"]), command=command, fault_results=faults)
            self.stdout.write(f"Wrote {path}.")
        if not report.cleanup_ok:
            raise CommandError("Some test records could not be archived; see 'NOT archived' above.", returncode=1)
        if not report.passed:
            raise CommandError("Stop did not hold in every drill; see FAIL rows above.", returncode=1)

    def _integration(self, options: dict[str, Any]) -> Integration | None:
        openai = options["openai_base_url"] or options["openai_api_key"]
        if not (options["crm_url"] or openai or options["mcp_url"]):
            return None
        if bool(options["mcp_url"]) != bool(options["mcp_tool"]):
            raise CommandError("--mcp-url and --mcp-tool go together.")
        try:
            arguments = json.loads(options["mcp_arguments"])
        except ValueError as exc:
            raise CommandError(f"--mcp-arguments is not JSON: {exc}") from exc
        return Integration(
            crm_url=options["crm_url"] or "",
            openai_base_url=options["openai_base_url"] or "",
            openai_api_key=options["openai_api_key"] or "",
            openai_model=options["openai_model"],
            mcp_url=options["mcp_url"] or "",
            mcp_tool=options["mcp_tool"] or "",
            mcp_arguments=arguments if isinstance(arguments, dict) else {},
        )


def recorded_arguments(options: dict[str, Any]) -> list[str]:
    """The command's arguments as the document records them, rebuilt from the parsed options (so
    also right under `call_command`): never the API key, and a file named by its path inside the
    project, or by its name alone when it lies elsewhere on this machine."""
    out: list[str] = []
    for drill in options.get("drill") or []:
        out += ["--drill", drill]
    for mechanism in options.get("mechanism") or []:
        out += ["--mechanism", mechanism]
    out += [flag for flag, name in (("--no-store", "no_store"), ("--brief", "brief")) if options.get(name)]
    for flag, name in (("--crm-url", "crm_url"), ("--openai-base-url", "openai_base_url")):
        if options.get(name):
            out += [flag, options[name]]
    if options.get("openai_api_key"):
        out += ["--openai-api-key", "***"]
    if options.get("openai_model") and options["openai_model"] != DEFAULT_MODEL:
        out += ["--openai-model", options["openai_model"]]
    if options.get("mcp_url"):
        out += ["--mcp-url", options["mcp_url"], "--mcp-tool", options.get("mcp_tool") or ""]
        if (options.get("mcp_arguments") or "{}") != "{}":
            out += ["--mcp-arguments", options["mcp_arguments"]]
    if options.get("write_reliability"):
        out.append("--write-reliability")
        written = _project_path(options["write_reliability"])
        if written != "docs/RELIABILITY.md":
            out.append(written)
    if options.get("fault_results"):
        out += ["--fault-results", _project_path(options["fault_results"])]
    return out


def _project_path(path: str) -> str:
    resolved = Path(path).resolve()
    try:
        return resolved.relative_to(Path(settings.BASE_DIR).resolve()).as_posix()
    except ValueError:
        return resolved.name
