from apps.accounts.api.views import ApiTokenViewSet, InvitationViewSet, MembershipViewSet, OrganizationViewSet


def register(router) -> None:
    router.register("organizations", OrganizationViewSet, basename="organization")
    router.register("tokens", ApiTokenViewSet, basename="token")
    router.register("memberships", MembershipViewSet, basename="membership")
    router.register("invitations", InvitationViewSet, basename="invitation")
