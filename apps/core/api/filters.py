"""Filter backend whose choice filters see only what the principal may see.

django-filter builds `?pool=<id>` as a choice among *every* pool, so a foreign id answered 200
(an empty page) while a missing id answered 400: an existence oracle. Here every model-choice
filter is narrowed to `restrict(principal, "view")`, so a foreign id is as invalid as a missing one.
"""

from __future__ import annotations

import datetime as dt

from django import forms
from django.db import models
from django_filters import fields as filter_fields
from django_filters import rest_framework as filters

from apps.core.tenancy import Action, restricted

# PostgreSQL stores time zone displacements up to 15:59; a larger one (valid ISO 8601) failed in the query.
MAX_UTC_OFFSET = dt.timedelta(hours=15, minutes=59)


class BoundedIsoDateTimeField(filter_fields.IsoDateTimeField):
    def to_python(self, value):
        parsed = super().to_python(value)
        offset = parsed.utcoffset() if parsed is not None else None
        if offset is not None and abs(offset) > MAX_UTC_OFFSET:
            raise forms.ValidationError("The UTC offset must be within -15:59..+15:59.", code="invalid")
        return parsed


class IsoDateTimeFilter(filters.IsoDateTimeFilter):
    field_class = BoundedIsoDateTimeField


class IPAddressFilter(filters.CharFilter):
    field_class = forms.GenericIPAddressField


class FilterSet(filters.FilterSet):
    """Base of every filterset: values the database would choke on are a 400 at the form, naming the filter."""

    FILTER_DEFAULTS = {
        **filters.FilterSet.FILTER_DEFAULTS,
        models.DateTimeField: {"filter_class": IsoDateTimeFilter},
        models.GenericIPAddressField: {"filter_class": IPAddressFilter},
    }


class ScopedFilterBackend(filters.DjangoFilterBackend):
    filterset_base = FilterSet

    def get_filterset(self, request, queryset, view):
        filterset = super().get_filterset(request, queryset, view)
        if filterset is None:
            return None
        principal = getattr(request, "principal", None)
        for flt in filterset.filters.values():
            if isinstance(flt, filters.IsoDateTimeFilter) and not hasattr(flt, "_field"):
                flt.field_class = BoundedIsoDateTimeField  # also in filtersets declared by hand
            if isinstance(flt, filters.ModelChoiceFilter | filters.ModelMultipleChoiceFilter):
                flt.queryset = restricted(_related_model(queryset.model, flt), principal, Action.VIEW)
        return filterset


def _related_model(model: type[models.Model], flt) -> type[models.Model]:
    if isinstance(flt.queryset, models.QuerySet):
        return flt.queryset.model
    for part in flt.field_name.split("__"):
        model = model._meta.get_field(part).related_model
    return model
