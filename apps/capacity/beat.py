"""Periodic capacity housekeeping: fail runs whose shards were lost."""


def register(app) -> None:
    app.add_periodic_task(60.0, app.signature("capacity.reap_stale_runs_task"), name="capacity-reap-stale-runs")
