from django.apps import AppConfig


class FleetsConfig(AppConfig):
    name = "apps.fleets"
    label = "fleets"

    def ready(self) -> None:
        from apps.fleets import metrics, receivers

        receivers.connect()
        metrics.register()
