from django.apps import AppConfig


class SignalsConfig(AppConfig):
    name = "apps.signals"
    label = "signals"

    def ready(self) -> None:
        from apps.signals import metrics

        metrics.register()
