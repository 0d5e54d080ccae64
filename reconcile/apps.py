from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured

from reconcile.mechanisms import folders


class ReconcileConfig(AppConfig):
    name = "reconcile"
    verbose_name = "reconciliation, review and compensation"

    def ready(self) -> None:
        # A mechanism folder nobody listed would be silently skipped by everything derived from
        # the list (settings, drills, sandbox, readiness): refuse to start instead.
        unlisted = folders.unlisted()
        if unlisted:
            raise ImproperlyConfigured("\n".join(unlisted))
        # In ready(): the ports' implementations import models, which needs the app registry.
        from reconcile.ports import ports_register

        ports_register()
