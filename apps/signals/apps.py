from django.apps import AppConfig


class SignalsConfig(AppConfig):
    name = "apps.signals"
    label = "signals"

    def ready(self) -> None:
        from apps.signals import impact, metrics

        metrics.register()
        impact.register()  # the watched canary's judge (apps.fleets.rollout.canary)
