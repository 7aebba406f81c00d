from apps.accounts.api.views import ApiTokenViewSet, MembershipViewSet, OrganizationViewSet


def register(router) -> None:
    router.register("organizations", OrganizationViewSet, basename="organization")
    router.register("tokens", ApiTokenViewSet, basename="token")
    router.register("memberships", MembershipViewSet, basename="membership")
