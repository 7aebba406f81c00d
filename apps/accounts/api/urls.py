from apps.accounts.api.views import ApiTokenViewSet, OrganizationViewSet


def register(router) -> None:
    router.register("organizations", OrganizationViewSet, basename="organization")
    router.register("tokens", ApiTokenViewSet, basename="token")
