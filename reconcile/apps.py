from django.apps import AppConfig


class ReconcileConfig(AppConfig):
    name = "reconcile"
    verbose_name = "reconciliation, review and compensation"

    def ready(self) -> None:
        # In ready(): the ports' implementations import models, which needs the app registry.
        from reconcile.ports import ports_register

        ports_register()
