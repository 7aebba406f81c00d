from django.urls import path

from apps.cloud.views import CloudApplyStatusView, CloudApplyView, CloudListView, CloudSynthView

urlpatterns = [
    path("cloud/", CloudListView.as_view(), name="cloud"),
    path("cloud/applies/<int:pk>/", CloudApplyView.as_view(), name="cloud-apply"),
    path("cloud/applies/<int:pk>/status/", CloudApplyStatusView.as_view(), name="cloud-apply-status"),
    path("cloud/applies/<int:pk>/main.tf.json", CloudSynthView.as_view(), name="cloud-apply-synth"),
]
