from apps.acme.api import views


def register(router) -> None:
    router.register("managed-certificates", views.ManagedCertificateViewSet, basename="managed-certificate")
