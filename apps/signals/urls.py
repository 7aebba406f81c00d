from django.urls import path

from apps.signals import views

urlpatterns = [
    path("signals/<slug:scope>/<int:pk>/", views.SignalsPanelView.as_view(), name="signals-panel"),
    path("changes/<int:pk>/", views.ChangeImpactPageView.as_view(), name="change-impact"),
    path("signals/requests/", views.SampledRequestsPageView.as_view(), name="signals-requests-page"),
]
