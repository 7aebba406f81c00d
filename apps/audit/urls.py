from django.urls import path

from apps.audit.views import AuditListView

urlpatterns = [path("audit/", AuditListView.as_view(), name="audit")]
