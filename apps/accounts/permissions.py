"""One permission class for every API view: read needs a principal; writes need a role and a scope."""

from __future__ import annotations

from rest_framework import permissions

from apps.accounts.models import Role


class OrgRolePermission(permissions.BasePermission):
    message = "Your role or token scope does not allow this change."

    def has_permission(self, request, view) -> bool:
        principal = getattr(request, "principal", None)
        if principal is None:
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        # On a detail route the operator-only rule waits for the object lookup, so an
        # outsider gets the same 404 for a foreign object as for a missing one.
        if getattr(view, "operator_only_write", False) and not principal.is_operator and not view.kwargs:
            return False
        required = getattr(view, "write_role", Role.EDITOR)
        return principal.can_write and principal.role_at_least(required)

    def has_object_permission(self, request, view, obj) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return not (getattr(view, "operator_only_write", False) and not request.principal.is_operator)
