from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.db.models.signals import post_save

# The Celery app, so that @shared_task binds to it in every Django process.
import stopdesk.celery  # noqa: F401
from stopdesk.audit_db import sqlite_register
from stopdesk.logs import log_event
from stopdesk.tracing import connect_celery_signals, tracing_setup


class StopdeskConfig(AppConfig):
    name = "stopdesk"
    verbose_name = "stopdesk ledger"

    def ready(self) -> None:
        tracing_setup()  # only when OTEL_* configures an exporter
        connect_celery_signals()

        # Every audit event also becomes a log line carrying its task and item ids.
        post_save.connect(log_event, sender="stopdesk.Event", dispatch_uid="stopdesk.logs.log_event")
        # SQLite's audit triggers call into Python; see stopdesk.audit_db.
        connection_created.connect(_register_sqlite_functions, dispatch_uid="stopdesk.audit_db")


def _register_sqlite_functions(sender, connection, **kwargs):  # type: ignore[no-untyped-def]
    if connection.vendor == "sqlite":
        sqlite_register(connection.connection)
