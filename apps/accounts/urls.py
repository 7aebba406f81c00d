from django.urls import path

from apps.accounts import views

urlpatterns = [
    path("tokens/", views.TokenListView.as_view(), name="tokens"),
    path("tokens/<int:pk>/revoke/", views.TokenRevokeView.as_view(), name="token-revoke"),
    path("members/", views.MembersView.as_view(), name="members"),
    path("switch-org/", views.SwitchOrgView.as_view(), name="switch-org"),
]
