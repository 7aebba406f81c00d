"""The accounts app's API routes, and its authenticators' OpenAPI descriptions: registered where the API's URLs
load (the schema is generated from them), not at every process start (drf-spectacular and what it imports, among
them django.test, Jinja2 and Pygments: ~70 ms of each Celery worker's and command's start, which never need it)."""

from apps.accounts import schema  # noqa: F401  (registers the OpenAPI auth schemes)
from apps.accounts.api.views import ApiTokenViewSet, InvitationViewSet, MembershipViewSet, OrganizationViewSet


def register(router) -> None:
    router.register("organizations", OrganizationViewSet, basename="organization")
    router.register("tokens", ApiTokenViewSet, basename="token")
    router.register("memberships", MembershipViewSet, basename="membership")
    router.register("invitations", InvitationViewSet, basename="invitation")
