from importlib import import_module

from django.contrib.auth import views as auth_views
from django.urls import include, path

from frontend import views
from frontend.auth import ThrottledLoginView

urlpatterns = [
    path("login/", ThrottledLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.DashboardView.as_view(), name="dashboard"),
    path("load-balancers/", views.LoadBalancerListView.as_view(), name="lb-list"),
    path("load-balancers/<int:pk>/", views.LoadBalancerDetailView.as_view(), name="lb-detail"),
    path("load-balancers/<int:pk>/routes/", views.RouteCreateView.as_view(), name="route-create"),
    path("members/<int:pk>/state/", views.MemberStateView.as_view(), name="member-state"),
]

# Each domain app may contribute UI pages in apps/<app>/urls.py (a `urlpatterns` list).
for _app in ["accounts", "audit", "fleets", "traffic", "capacity", "scheduling", "cloud"]:
    try:
        import_module(f"apps.{_app}.urls")
    except ModuleNotFoundError as exc:
        if exc.name != f"apps.{_app}.urls":
            raise
        continue
    urlpatterns.append(path("", include(f"apps.{_app}.urls")))
