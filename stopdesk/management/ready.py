"""Commands a user is told to run check the database first, so a fresh clone (never migrated) or a
database that does not answer gets one line saying what to do instead of a traceback."""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.utils import Error

from stopdesk import config


def require_migrated_database() -> None:
    """Raise CommandError (one line) when the database cannot be reached or is not migrated."""
    connection = connections[DEFAULT_DB_ALIAS]
    # An open connection (a caller's transaction, as under call_command in tests) already answered;
    # the reachability check closes its connection, so it runs only before the first one.
    if connection.connection is None and (problem := config.check_database()):
        raise CommandError(problem)
    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except Error as exc:
        raise CommandError(f"cannot read the database's migrations ({str(exc).strip().splitlines()[0]}).") from None
    if pending:
        where = config.describe_database(connection.settings_dict)
        raise CommandError(
            f"the database at {where} is not migrated ({len(pending)} migration(s) to apply); "
            "run `python manage.py migrate` first (`make run` does it for you)."
        )
