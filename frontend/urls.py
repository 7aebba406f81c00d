
from django.contrib.auth import views as auth_views
from django.urls import include, path

from apps.core.discovery import app_modules
from frontend import (
    dashboard,
    forms,
    forms_cloud,
    forms_ops,
    hostnames,
    infrastructure,
    listeners,
    route_tester,
    views,
    workspace,
)
from frontend.auth import ThrottledLoginView

urlpatterns = [
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", dashboard.DashboardView.as_view(), name="dashboard"),
    path("dashboard/<slug:panel>/", dashboard.DashboardPanelView.as_view(), name="dashboard-panel"),
    path("load-balancers/", views.LoadBalancerListView.as_view(), name="lb-list"),
    path("load-balancers/<int:pk>/", workspace.LoadBalancerDetailView.as_view(), name="lb-detail"),
    path("load-balancers/<int:pk>/changes/", workspace.LbChangesView.as_view(), name="lb-changes"),
    path("load-balancers/<int:pk>/serving/", workspace.LbServingView.as_view(), name="lb-serving"),
    path("load-balancers/<int:pk>/changes/<int:event>/revert/", workspace.LbChangesView.as_view(),
         name="lb-change-revert"),
    path("load-balancers/<int:pk>/routes/", workspace.RoutesView.as_view(), name="route-create"),
    path("load-balancers/<int:pk>/routes/preview/", workspace.RoutePreviewView.as_view(), name="route-preview"),
    path("load-balancers/<int:pk>/route-test/", route_tester.RouteTestView.as_view(), name="lb-route-test-ui"),
    path("load-balancers/<int:pk>/deploy/", workspace.DeployStatusPartial.as_view(), name="lb-deploy-status"),
    path("load-balancers/<int:pk>/static-ips/", workspace.StaticIpsView.as_view(), name="lb-static-ips"),
    path("load-balancers/<int:pk>/static-ips/<int:ip>/release/", workspace.StaticIpReleaseView.as_view(),
         name="lb-static-ip-release"),
    path("listeners/<int:pk>/static-ip/", listeners.ListenerStaticIpView.as_view(), name="listener-static-ip"),
    path("listeners/<int:pk>/vip/", listeners.ListenerVipView.as_view(), name="listener-vip"),
    path("routes/<int:pk>/", workspace.RouteView.as_view(), name="route-detail"),
    path("routes/<int:pk>/edit/", workspace.RouteEditView.as_view(), name="route-edit"),
    path("pools/<int:pk>/health/", workspace.PoolHealthPartial.as_view(), name="pool-health"),
    path("members/<int:pk>/state/", workspace.MemberStateView.as_view(), name="member-state"),
    path("hostnames/", hostnames.HostnamesView.as_view(), name="hostnames"),
    path("hostnames/<int:pk>/", hostnames.HostnameDetailView.as_view(), name="hostname-detail"),
    path("hostnames/<int:pk>/<slug:verb>/", hostnames.HostnameDecideView.as_view(), name="hostname-decide"),
    # Forms over the API's serializers and services (apps.core.service_forms.ServiceFormView).
    path("load-balancers/<int:lb>/pools/new/", forms.PoolCreateView.as_view(), name="pool-new"),
    path("pools/<int:pk>/edit/", forms.PoolEditView.as_view(), name="pool-edit"),
    path("pools/<int:pool>/regions/new/", forms.PoolRegionCreateView.as_view(), name="pool-region-new"),
    path("pool-regions/<int:pk>/edit/", forms.PoolRegionEditView.as_view(), name="pool-region-edit"),
    path("pools/<int:pool>/members/new/", forms.MemberCreateView.as_view(), name="member-new"),
    path("members/<int:pk>/edit/", forms.MemberEditView.as_view(), name="member-edit"),
    path("load-balancers/<int:lb>/listeners/new/", forms.ListenerCreateView.as_view(), name="listener-new"),
    path("listeners/<int:pk>/edit/", forms.ListenerEditView.as_view(), name="listener-edit"),
    path("fleets/new/", forms_ops.FleetFormView.as_view(), name="fleet-new"),
    path("fleets/<int:pk>/edit/", forms_ops.FleetFormView.as_view(), name="fleet-edit"),
    path("load-balancers/new/", forms_ops.LoadBalancerFormView.as_view(), name="lb-new"),
    path("load-balancers/<int:pk>/edit/", forms_ops.LoadBalancerFormView.as_view(), name="lb-edit"),
    path("nodes/new/", forms_ops.NodeFormView.as_view(), name="node-new"),
    path("nodes/<int:pk>/edit/", forms_ops.NodeFormView.as_view(), name="node-edit"),
    path("nodes/<int:pk>/decommission/", forms_ops.NodeDecommissionView.as_view(), name="node-decommission"),
    path("nodes/<int:pk>/service/<slug:state>/", forms_ops.NodeStateView.as_view(), name="node-service"),
    path("certificates/upload/", forms_ops.CertificateUploadView.as_view(), name="certificate-upload"),
    path("certificates/<int:pk>/replace/", forms_ops.CertificateUploadView.as_view(), name="certificate-replace"),
    path("cloud/targets/new/", forms_cloud.CloudTargetFormView.as_view(), name="cloud-target-new"),
    path("cloud/targets/<int:pk>/edit/", forms_cloud.CloudTargetFormView.as_view(), name="cloud-target-edit"),
    path("cloud/runs/new/", forms_cloud.CloudRunFormView.as_view(), name="cloud-run-new"),
    path("infrastructure/", infrastructure.InfrastructureView.as_view(), name="infrastructure"),
    path("infrastructure/regions/new/", forms.RegionFormView.as_view(), name="region-new"),
    path("infrastructure/regions/<int:pk>/", forms.RegionFormView.as_view(), name="region-edit"),
    path("infrastructure/distances/new/", forms.RegionDistanceFormView.as_view(), name="distance-new"),
    path("infrastructure/distances/<int:pk>/", forms.RegionDistanceFormView.as_view(), name="distance-edit"),
    path("infrastructure/ip-pools/new/", forms.IpPoolFormView.as_view(), name="ip-pool-new"),
    path("infrastructure/ip-pools/<int:pk>/", forms.IpPoolFormView.as_view(), name="ip-pool-edit"),
]

# Each domain app may contribute UI pages in apps/<app>/urls.py (a `urlpatterns` list).
for _module in app_modules("urls"):
    urlpatterns.append(path("", include(_module.__name__)))
