def register(app) -> None:
    app.add_periodic_task(600.0, app.signature("core.cleanup_task"), name="core-cleanup")
