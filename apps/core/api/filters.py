"""Filter backend whose choice filters see only what the principal may see.

django-filter builds `?pool=<id>` as a choice among *every* pool, so a foreign id answered 200
(an empty page) while a missing id answered 400: an existence oracle. Here every model-choice
filter is narrowed to `restrict(principal, "view")`, so a foreign id is as invalid as a missing one.
"""

from __future__ import annotations

from django.db import models
from django_filters import rest_framework as filters

from apps.core.tenancy import Action, restricted


class ScopedFilterBackend(filters.DjangoFilterBackend):
    def get_filterset(self, request, queryset, view):
        filterset = super().get_filterset(request, queryset, view)
        if filterset is None:
            return None
        principal = getattr(request, "principal", None)
        for flt in filterset.filters.values():
            if isinstance(flt, filters.ModelChoiceFilter | filters.ModelMultipleChoiceFilter):
                flt.queryset = restricted(_related_model(queryset.model, flt), principal, Action.VIEW)
        return filterset


def _related_model(model: type[models.Model], flt) -> type[models.Model]:
    if isinstance(flt.queryset, models.QuerySet):
        return flt.queryset.model
    for part in flt.field_name.split("__"):
        model = model._meta.get_field(part).related_model
    return model
