from apps.scheduling.api import views


def register(router) -> None:
    router.register("jobs", views.JobViewSet, basename="job")
    router.register("job-runs", views.JobRunViewSet, basename="job-run")
