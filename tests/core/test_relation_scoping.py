"""Every relation field a caller can write through the API resolves only among rows it may use.

Structural guard for the tenancy rule: it walks every serializer of every registered API view
(the viewset's own, each action's, and nested ones) and fails on a writable relation field that is
not a scoped one. A new relation field is therefore safe, or this test names it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rest_framework import serializers
from rest_framework.relations import ManyRelatedField, RelatedField

from apps.core.api.fields import ScopedRelatedField, ScopedSlugRelatedField
from controlplane.api import router

SCOPED = (ScopedRelatedField, ScopedSlugRelatedField)


def _serializer_classes() -> Iterator[tuple[str, type[serializers.BaseSerializer]]]:
    for prefix, viewset, _basename in router.registry:
        classes = {getattr(viewset, "serializer_class", None)}
        for name in dir(viewset):
            method = getattr(viewset, name, None)
            kwargs = getattr(method, "kwargs", None)
            if getattr(method, "mapping", None) is not None and isinstance(kwargs, dict):
                classes.add(kwargs.get("serializer_class"))
        for cls in classes - {None}:
            yield prefix, cls


def _writable_relations(serializer: serializers.BaseSerializer, path: str) -> Iterator[tuple[str, object]]:
    if isinstance(serializer, serializers.ListSerializer):
        serializer = serializer.child
    for name, field in serializer.fields.items():
        if field.read_only:
            continue
        where = f"{path}.{name}"
        if isinstance(field, ManyRelatedField):
            yield where, field.child_relation
        elif isinstance(field, RelatedField):
            yield where, field
        elif isinstance(field, serializers.BaseSerializer):
            yield from _writable_relations(field, where)
        elif isinstance(field, serializers.ListField) and isinstance(field.child, serializers.BaseSerializer):
            yield from _writable_relations(field.child, where)


def all_writable_relations() -> list[tuple[str, object]]:
    found = []
    for prefix, cls in _serializer_classes():
        found.extend(_writable_relations(cls(), f"{prefix}:{cls.__name__}"))
    return found


def test_the_walk_finds_the_fields_that_matter():
    names = {where for where, _ in all_writable_relations()}
    assert any(n.endswith("ListenerSerializer.certificate") for n in names), names
    assert any(n.endswith("RouteTargetSerializer.pool") or ".targets.pool" in n for n in names), names


@pytest.mark.parametrize("where,field", all_writable_relations(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_writable_relation_field_is_scoped(where, field):
    assert isinstance(field, SCOPED), (
        f"{where} is a {type(field).__name__}: a tenant could name any row there. Use ScopedRelatedField "
        f"(or let TenantModelSerializer build it).")
