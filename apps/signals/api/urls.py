from django.urls import path

from apps.signals.api import views


def register(router) -> None:
    """Signals have no model endpoints; their path is below."""


urlpatterns = [
    path("signals/", views.SignalsView.as_view(), name="signals"),
    path("signals/changes/<int:pk>/", views.ChangeImpactView.as_view(), name="signals-change"),
    path("signals/requests/", views.SampledRequestsView.as_view(), name="signals-requests"),
]
