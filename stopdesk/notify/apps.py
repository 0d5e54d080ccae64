from django.apps import AppConfig


class NotifyConfig(AppConfig):
    name = "stopdesk.notify"
    label = "notify"
    verbose_name = "notifications"

    def ready(self) -> None:
        # In ready(): heartbeat uses notify's models, which need the app registry.
        from stopdesk.notify import heartbeat

        heartbeat.connect_beat_signal()
