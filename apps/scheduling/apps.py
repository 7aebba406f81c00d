from django.apps import AppConfig


class SchedulingConfig(AppConfig):
    name = "apps.scheduling"
    label = "scheduling"

    def ready(self) -> None:
        # Job kinds register themselves on import: the built-in ones and those driving other apps.
        from apps.core import lifecycle
        from apps.scheduling import kinds, kinds_external  # noqa: F401
        from apps.scheduling.models import Job
        from apps.scheduling.services import jobs_stop_for

        lifecycle.register(Job, stop=jobs_stop_for)
