from django.urls import path

from apps.acme.views import CertificateListView, CertificateRenewView

urlpatterns = [
    path("certificates/", CertificateListView.as_view(), name="certificates"),
    path("certificates/<int:pk>/renew/", CertificateRenewView.as_view(), name="certificate-renew"),
]
