from django.apps import AppConfig


class FleetsConfig(AppConfig):
    name = "apps.fleets"
    label = "fleets"

    def ready(self) -> None:
        from apps.fleets import queries, receivers
        from apps.fleets.health import metrics
        from apps.traffic import readers

        receivers.connect()
        metrics.register()
        # Traffic sits below fleets and cannot import it; it reads node health and pool nodes through these.
        readers.provide(health_rows=queries.health_rows, pool_nodes=queries.pool_nodes)
