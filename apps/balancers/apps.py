from django.apps import AppConfig


class BalancersConfig(AppConfig):
    name = "apps.balancers"
    label = "balancers"

    def ready(self) -> None:
        from apps.balancers.models import HostnameClaim, LoadBalancer, Route, StaticIP
        from apps.core import quotas

        quotas.count_with("static_ips", lambda org: StaticIP.objects.filter(org=org).count())
        quotas.count_with("hostname_claims", lambda org: HostnameClaim.objects.filter(org=org).exclude(
            status=HostnameClaim.Status.REJECTED).count())
        quotas.count_with("load_balancers", lambda org: LoadBalancer.objects.filter(org=org).count())
        quotas.count_with("routes", lambda org: Route.objects.filter(org=org).count())
