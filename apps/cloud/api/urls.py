from apps.cloud.api import views


def register(router) -> None:
    router.register("cloud-credentials", views.CloudCredentialViewSet, basename="cloud-credential")
    router.register("cloud-targets", views.CloudTargetViewSet, basename="cloud-target")
    router.register("cloud-applies", views.CloudApplyViewSet, basename="cloud-apply")
