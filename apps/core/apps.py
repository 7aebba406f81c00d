from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "apps.core"
    label = "core"

    def ready(self) -> None:
        # Every urllib3 connection (requests, the ACME client, single sign-on) under a deadline (apps.core.outbound).
        from apps.core import outbound

        outbound.install()
        # `field__any=[...]`: a list as one array parameter, so prepared queries can take lists of ids.
        from apps.core import prepared

        prepared.register_lookups()
