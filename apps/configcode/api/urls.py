from django.urls import path

from apps.configcode.api import views

urlpatterns = [
    path("export/", views.ExportView.as_view(), name="config-export"),
    path("apply/", views.ApplyView.as_view(), name="config-apply"),
]


def register(router) -> None:
    """No router viewsets: export and apply are single endpoints (urlpatterns above)."""
