from django.urls import path

from apps.fleets.api import views


def register(router) -> None:
    router.register("fleets", views.FleetViewSet, basename="fleet")
    router.register("nodes", views.NodeViewSet, basename="node")
    router.register("config-revisions", views.ConfigRevisionViewSet, basename="config-revision")
    router.register("rollouts", views.RolloutViewSet, basename="rollout")
    router.register("certificates", views.CertificateViewSet, basename="certificate")


# Extra endpoints on load balancers (balancers' router owns the resource, fleets owns delivery).
urlpatterns = [
    path("load-balancers/<int:pk>/preview/", views.LoadBalancerPreviewView.as_view(), name="lb-preview"),
    path("load-balancers/<int:pk>/applied/", views.LoadBalancerAppliedView.as_view(), name="lb-applied"),
    path("listeners/<int:pk>/vip/", views.ListenerVipView.as_view(), name="listener-vip"),
    path("load-balancers/<int:pk>/route-test/", views.LoadBalancerRouteTestView.as_view(), name="lb-route-test"),
]
