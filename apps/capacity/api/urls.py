from apps.capacity.api import views


def register(router) -> None:
    router.register("capacity-tests", views.CapacityTestViewSet, basename="capacity-test")
    router.register("capacity-runs", views.CapacityRunViewSet, basename="capacity-run")
    router.register("capacity-allowlist", views.TargetAllowlistViewSet, basename="capacity-allowlist")
    router.register("drills", views.DrillViewSet, basename="drill")
