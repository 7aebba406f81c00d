from django.apps import AppConfig


class FleetsConfig(AppConfig):
    name = "apps.fleets"
    label = "fleets"

    def ready(self) -> None:
        from apps.fleets import metrics, receivers, selectors
        from apps.traffic import readers

        receivers.connect()
        metrics.register()
        # Traffic sits below fleets and cannot import it; it reads node health and pool nodes through these.
        readers.provide(health_rows=selectors.health_rows, pool_nodes=selectors.pool_nodes)
