"""Every relation field a caller can write through the API resolves only among rows it may use.

Structural guard for the tenancy rule: it walks every serializer of every registered API view
(the viewset's own, each action's, and nested ones) and fails on a writable relation field that is
not a scoped one. A new relation field is therefore safe, or this test names it.
"""

from __future__ import annotations

import pytest

from apps.core.api.fields import ScopedRelatedField, ScopedSlugRelatedField
from tests.core.relationkit import all_writable_relations

SCOPED = (ScopedRelatedField, ScopedSlugRelatedField)


def test_the_walk_finds_the_fields_that_matter():
    names = {where for where, _ in all_writable_relations()}
    assert any(n.endswith("ListenerSerializer.certificate") for n in names), names
    assert any(n.endswith("RouteTargetSerializer.pool") or ".targets.pool" in n for n in names), names


@pytest.mark.parametrize("where,field", all_writable_relations(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_writable_relation_field_is_scoped(where, field):
    assert isinstance(field, SCOPED), (
        f"{where} is a {type(field).__name__}: a tenant could name any row there. Use ScopedRelatedField "
        f"(or let TenantModelSerializer build it).")
