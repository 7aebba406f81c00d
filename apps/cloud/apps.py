from django.apps import AppConfig


class CloudConfig(AppConfig):
    name = "apps.cloud"
    label = "cloud"

    def ready(self) -> None:
        from apps.cloud.models import CloudApply
        from apps.core import lifecycle

        lifecycle.register(CloudApply, why_inert="a plan is applied only when a current deployer approves it")
