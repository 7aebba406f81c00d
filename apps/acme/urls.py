from django.urls import path

from apps.acme.views import CertificateListView, CertificateRenewView, ManagedCertificateRequestView

urlpatterns = [
    path("certificates/", CertificateListView.as_view(), name="certificates"),
    path("certificates/request/", ManagedCertificateRequestView.as_view(), name="certificate-request"),
    path("certificates/<int:pk>/renew/", CertificateRenewView.as_view(), name="certificate-renew"),
]
