from apps.balancers.api import views


def register(router) -> None:
    router.register("regions", views.RegionViewSet, basename="region")
    router.register("region-distances", views.RegionDistanceViewSet, basename="region-distance")
    router.register("load-balancers", views.LoadBalancerViewSet, basename="load-balancer")
    router.register("listeners", views.ListenerViewSet, basename="listener")
    router.register("pools", views.PoolViewSet, basename="pool")
    router.register("pool-regions", views.PoolRegionViewSet, basename="pool-region")
    router.register("members", views.MemberViewSet, basename="member")
    router.register("routes", views.RouteViewSet, basename="route")
    router.register("hostname-claims", views.HostnameClaimViewSet, basename="hostname-claim")
    router.register("ip-pools", views.IpPoolViewSet, basename="ip-pool")
    router.register("static-ips", views.StaticIPViewSet, basename="static-ip")
