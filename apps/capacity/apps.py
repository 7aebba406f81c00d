from django.apps import AppConfig


class CapacityConfig(AppConfig):
    name = "apps.capacity"
    label = "capacity"

    def ready(self) -> None:
        from apps.capacity.models import CapacityTest, TargetAllowlist
        from apps.core import lifecycle

        lifecycle.register(CapacityTest, why_inert="a test definition runs only when a member or a job starts it")
        lifecycle.register(TargetAllowlist, why_inert="an operator's allowlist entry is data, not an actor")
