from apps.accounts.services import principal_for_user


def principal(request):
    p = getattr(request, "principal", None)
    if p is None and getattr(request, "user", None) is not None and request.user.is_authenticated:
        p = principal_for_user(request.user, request.session.get("org"))
        request.principal = p
    return {"principal": p}
