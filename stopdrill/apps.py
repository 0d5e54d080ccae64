from django.apps import AppConfig


class StopdrillConfig(AppConfig):
    name = "stopdrill"
    verbose_name = "drills, sandbox and demo"
