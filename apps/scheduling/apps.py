from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "apps.scheduling"
    label = "scheduling"

    def ready(self) -> None:
        # Job kinds register themselves on import: the built-in ones and those driving other apps.
        from apps.scheduling import kinds, kinds_external  # noqa: F401
