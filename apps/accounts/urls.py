from django.urls import path

from apps.accounts import sso_views, views

urlpatterns = [
    path("tokens/", views.TokenListView.as_view(), name="tokens"),
    path("tokens/<int:pk>/revoke/", views.TokenRevokeView.as_view(), name="token-revoke"),
    path("members/", views.MembersView.as_view(), name="members"),
    path("invitations/", views.InvitationsView.as_view(), name="invitations"),
    path("quotas/", views.QuotasView.as_view(), name="quotas"),
    path("oidc/authenticate/", sso_views.SsoLoginView.as_view(), name="sso-login"),
    path("oidc/callback/", sso_views.SsoCallbackView.as_view(), name="sso-callback"),
    path("switch-org/", views.SwitchOrgView.as_view(), name="switch-org"),
]
