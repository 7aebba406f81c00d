"""The one way to reach tenant-owned rows: `Model.objects.visible_to(principal)`."""

from __future__ import annotations

from django.db import models


class TenantQuerySet(models.QuerySet):
    """Rows owned by an org, found through `TENANT_PATH` on the model (e.g. "pool__org").

    Operators see everything; anyone else sees only their own org's rows. A foreign
    row is simply absent, so views answer 404 for it as for a missing one.
    """

    def visible_to(self, principal) -> TenantQuerySet:
        if principal.is_operator:
            return self
        return self.filter(**{f"{self.model.TENANT_PATH}_id": principal.org_id})
