"""Base API viewset: tenancy scoping, ETag/If-Match, Idempotency-Key, services for writes.

Every endpoint inherits `TenantViewSet`, so none can forget the scope: `get_queryset()` is always
`Model.objects.restrict(principal, "view")` (a foreign object is a 404 like a missing one), and a
write to an object the principal may see but not change (a shared LB, an org's settings) is a 403.
Subclasses narrow or annotate the scoped queryset in `scope_queryset`, never replace it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from typing import Any

from django.db import IntegrityError, transaction
from rest_framework import permissions, status, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response

from apps.core import produced
from apps.core.api.errors import ApiError, PreconditionFailed
from apps.core.models import IdempotencyRecord
from apps.core.tenancy import Action, restricted

_KEY_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


def etag_for(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, default=str).encode()
    return '"' + hashlib.sha256(blob).hexdigest()[:32] + '"'


class TenantViewSet(viewsets.ModelViewSet):
    model = None  # set by subclasses
    select_related: tuple[str, ...] = ()
    prefetch_related: tuple[str, ...] = ()
    # Response keys never stored for an Idempotency-Key replay (secrets shown once, e.g. a new token).
    idempotency_redact: tuple[str, ...] = ()
    # perform_create in a transaction of its own; False where the service already writes in one (and a savepoint
    # inside ours would cost round trips under a lock).
    create_in_transaction = True

    @property
    def principal(self):
        return self.request.principal

    def initial(self, request, *args, **kwargs):
        produced.start()  # the LB revisions this request's writes make, for its answer
        super().initial(request, *args, **kwargs)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        if request.method not in permissions.SAFE_METHODS:
            produced.stamp(response, produced.take())
        return response

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no principal
            return self.model.objects.none()
        qs = restricted(self.model, self.principal, Action.VIEW)
        if self.select_related:
            qs = qs.select_related(*self.select_related)
        if self.prefetch_related:
            qs = qs.prefetch_related(*self.prefetch_related)
        return self.scope_queryset(qs)

    def scope_queryset(self, qs):
        """Hook to narrow or annotate the already-scoped queryset (e.g. hide free IPs)."""
        return qs

    def get_object(self):
        obj = super().get_object()  # 404 for missing and foreign alike
        if self.request.method not in permissions.SAFE_METHODS and not restricted(
                self.model, self.principal, Action.CHANGE).filter(pk=obj.pk).exists():
            # Visible (a shared LB, the org itself) but not the caller's to change.
            raise PermissionDenied("You can see this object but not change it.")
        return obj

    # --- ETag / If-Match -------------------------------------------------------------

    def retrieve(self, request, *args, **kwargs):
        response = super().retrieve(request, *args, **kwargs)
        response["ETag"] = etag_for(response.data)
        return response

    def _check_if_match(self, instance) -> None:
        wanted = self.request.headers.get("If-Match")
        if not wanted or wanted.strip() == "*":
            return
        current = etag_for(self.get_serializer(instance).data)
        candidates = {tag.strip().removeprefix("W/") for tag in wanted.split(",")}
        if current not in candidates:
            raise PreconditionFailed()

    def _locked_instance(self):
        instance = self.get_object()  # 404 for missing and foreign alike
        # Lock the row so the If-Match comparison and the write see the same version.
        type(instance).objects.select_for_update().filter(pk=instance.pk).values_list("pk").first()
        instance.refresh_from_db()
        return instance

    def update(self, request, *args, **kwargs):
        partial = kwargs.pop("partial", False)
        with transaction.atomic():
            instance = self._locked_instance()
            self._check_if_match(instance)
            serializer = self.get_serializer(instance, data=request.data, partial=partial)
            serializer.is_valid(raise_exception=True)
            self.perform_update(serializer)
        data = self.get_serializer(serializer.instance).data
        return Response(data, headers={"ETag": etag_for(data)})

    def destroy(self, request, *args, **kwargs):
        with transaction.atomic():
            instance = self._locked_instance()
            self._check_if_match(instance)
            self.perform_destroy(instance)
        return Response(status=status.HTTP_204_NO_CONTENT)

    # --- Idempotency-Key ----------------------------------------------------------------

    def create(self, request, *args, **kwargs):
        key = request.headers.get("Idempotency-Key")
        if not key:
            return self._create(request, *args, **kwargs)
        if not _KEY_RE.match(key):
            raise ApiError("invalid_idempotency_key", "Idempotency-Key must be 1-128 characters of [A-Za-z0-9_.:-].")
        body = json.dumps(request.data, sort_keys=True, default=str)
        method_path = f"{request.method} {request.path}"[:300]
        digest = hashlib.sha256(f"{method_path}\n{body}".encode()).hexdigest()
        scope = self.principal.actor
        # One transaction for the key, the create and the stored answer: a request killed (web process lost) or
        # cut off by the database at any point leaves neither the object nor a key stuck "in progress", so the
        # client's retry with the same key runs it again. A concurrent request with the same key waits on the
        # key's unique index until this one ends, then replays its answer (or runs, if this one rolled back).
        with transaction.atomic():
            try:
                with transaction.atomic():
                    record = IdempotencyRecord.objects.create(scope=scope, key=key, method_path=method_path,
                                                              request_hash=digest)
            except IntegrityError:
                record = None
            if record is not None:
                response = self._create(request, *args, **kwargs)
                produced.stamp(response, produced.take())  # stored with the answer, so a replay says it too
                body = response.data
                if self.idempotency_redact and isinstance(body, dict):
                    body = {k: (None if k in self.idempotency_redact else v) for k, v in body.items()}
                record.status_code, record.body = response.status_code, body
                record.save(update_fields=["status_code", "body"])
                return response
        # The key was taken by a request that has ended (its transaction committed): replay its answer.
        record = IdempotencyRecord.objects.filter(scope=scope, key=key).first()
        if record is None:  # a concurrent first request with this key failed and freed it this instant
            raise ApiError("idempotency_in_progress", "A request with this Idempotency-Key was just running; "
                           "retry.", status.HTTP_409_CONFLICT)
        if record.request_hash != digest:
            raise ApiError("idempotency_key_reused",
                           "This Idempotency-Key was used with a different request; use a new key.",
                           status.HTTP_422_UNPROCESSABLE_ENTITY)
        if record.status_code is None:
            raise ApiError("idempotency_in_progress", "A request with this Idempotency-Key is still running.",
                           status.HTTP_409_CONFLICT)
        headers = {"Idempotent-Replayed": "true"}
        if isinstance(record.body, dict) and "lb_revision" in record.body:
            headers[produced.HEADER] = str(record.body["lb_revision"])
        return Response(record.body, status=record.status_code, headers=headers)

    def _create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic() if self.create_in_transaction else contextlib.nullcontext():
            self.perform_create(serializer)
        data = self.get_serializer(serializer.instance).data
        return Response(data, status=status.HTTP_201_CREATED, headers={"ETag": etag_for(data)})
