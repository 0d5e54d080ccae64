from django.apps import AppConfig


class StopdeskConfig(AppConfig):
    name = "stopdesk"
    verbose_name = "stopdesk ledger"
