from django.utils import timezone

from apps.accounts.models import Invitation
from apps.accounts.services import memberships_of, principal_for_user


def principal(request):
    p = getattr(request, "principal", None)
    if p is None and getattr(request, "user", None) is not None and request.user.is_authenticated:
        p = principal_for_user(request.user, request.session.get("org"))
        request.principal = p
    # The org switcher in the header lists the orgs a signed-in user can act in.
    orgs = [m.org for m in memberships_of(request.user)] if p is not None and p.user_id else []
    invited = 0
    if p is not None and p.user_id:
        invited = Invitation.objects.addressed_to(p).filter(status=Invitation.Status.PENDING,
                                                            expires_at__gt=timezone.now()).count()
    return {"principal": p, "switch_orgs": orgs if len(orgs) > 1 else [], "invitations_pending": invited}
