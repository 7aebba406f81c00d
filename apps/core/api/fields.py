"""Serializer fields and validators shared by every app's API.

String fields that will ever reach a proxy config are validated here, at the edge,
with the strict allowlists in apps.core.validators (the renderer checks them again).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rest_framework import serializers

from apps.core import validators as v
from apps.core.api.strict import StrictFieldsMixin
from apps.core.tenancy import Action, restricted, scope_for


def allowlisted(check: Callable[[Any], Any]) -> Callable[[Any], None]:
    def run(value: Any) -> None:
        try:
            check(value)
        except v.InvalidValue as exc:
            raise serializers.ValidationError(exc.message, code=exc.code) from exc

    return run


validate_hostname = allowlisted(v.validate_hostname)
validate_path = allowlisted(v.validate_path)
validate_slug = allowlisted(v.validate_slug)
validate_redirect_url = allowlisted(v.validate_redirect_url)
validate_ip = allowlisted(v.validate_ip)
validate_address_port = allowlisted(v.validate_address_port)


class SlugNameField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 63)
        super().__init__(validators=[validate_slug], **kwargs)


class HostnameField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 253)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(validators=[validate_hostname], **kwargs)


class PathField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 1024)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(validators=[validate_path], **kwargs)


class RedirectUrlField(serializers.CharField):
    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", 2048)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(validators=[validate_redirect_url], **kwargs)


def _principal(field: serializers.Field):
    request = field.context.get("request")
    return getattr(request, "principal", None)


class ScopedRelatedField(serializers.PrimaryKeyRelatedField):
    """A reference by id, resolved only among rows the principal may *use*.

    Another tenant's id reads as "does not exist", exactly like a missing id. `action` narrows
    further where a field needs it (e.g. a listener may only hang on an LB its caller may change).
    """

    def __init__(self, model=None, *, action: Action | str = Action.USE, limit_choices: dict | None = None,
                 **kwargs: Any) -> None:
        if model is None and kwargs.get("queryset") is not None:  # built by ModelSerializer
            model = kwargs["queryset"].model
        self.model = model
        self.scope_action = Action(action)
        self.limit_choices = limit_choices or {}
        if not kwargs.get("read_only"):
            kwargs.setdefault("queryset", model._default_manager.all())
        super().__init__(**kwargs)

    def get_queryset(self):
        return restricted(self.model, _principal(self), self.scope_action).filter(**self.limit_choices)


class ScopedSlugRelatedField(serializers.SlugRelatedField):
    def __init__(self, model=None, slug_field: str = "slug", *, action: Action | str = Action.USE,
                 **kwargs: Any) -> None:
        if model is None and kwargs.get("queryset") is not None:
            model = kwargs["queryset"].model
        self.model = model
        self.scope_action = Action(action)
        if not kwargs.get("read_only"):
            kwargs.setdefault("queryset", model._default_manager.all())
        super().__init__(slug_field=slug_field, **kwargs)

    def get_queryset(self):
        return restricted(self.model, _principal(self), self.scope_action)


SCOPED_FIELDS = (ScopedRelatedField, ScopedSlugRelatedField)


def _foreign_to(serializer: serializers.BaseSerializer, attrs: Any, scope: Any) -> dict[str, Any]:
    """Errors for every reference in `attrs` (this serializer's validated data, nested rows included) that
    `scope` may not use, worded exactly as a missing row's, so a foreign row is no oracle."""
    if isinstance(serializer, serializers.ListSerializer):
        serializer = serializer.child
    if not isinstance(attrs, dict):
        return {}
    errors: dict[str, Any] = {}
    for name, field in serializer.fields.items():
        if field.read_only or field.source not in attrs or attrs[field.source] is None:
            continue
        value = attrs[field.source]
        if isinstance(field, serializers.ManyRelatedField) and isinstance(field.child_relation, SCOPED_FIELDS):
            relation, values = field.child_relation, list(value)
        elif isinstance(field, SCOPED_FIELDS):
            relation, values = field, [value]
        elif isinstance(field, serializers.BaseSerializer):
            rows = value if isinstance(value, list) else [value]
            nested = {str(i): e for i, row in enumerate(rows) if (e := _foreign_to(field, row, scope))}
            if nested:  # as the API words a nested row's errors: keyed by the row's index
                errors[name] = nested if isinstance(value, list) else nested["0"]
            continue
        else:
            continue
        allowed = set(restricted(relation.model, scope, relation.scope_action)
                      .filter(pk__in=[v.pk for v in values]).values_list("pk", flat=True))
        foreign = [v for v in values if v.pk not in allowed]
        if foreign:
            sent = getattr(foreign[0], relation.slug_field, foreign[0].pk) if isinstance(
                relation, ScopedSlugRelatedField) else foreign[0].pk
            errors[name] = [serializers.ErrorDetail(
                relation.error_messages["does_not_exist"].format(pk_value=sent, slug_name=getattr(
                    relation, "slug_field", ""), value=sent), code="does_not_exist")]
    return errors


class ActingForMixin:
    """Every reference a write names resolves in the scope of the org it writes into (`scope_for`).

    The relation fields already resolve among rows the *caller* may use; for an operator writing into a
    tenant's org that is every row. So the root serializer checks each reference again, nested rows
    included, in the scope of the org the write lands in (`target_org`), before its own `validate` rules.
    A customer writes only into its own org, where both scopes are one: the check costs nothing there.
    """

    def target_org(self, attrs: dict[str, Any]) -> Any:
        """The org this write lands in: along the model's TENANT_PATH from the validated data (or the object
        being changed), or an `org` field for a serializer that is not a model's. None: no tenant."""
        meta = getattr(self, "Meta", None)
        path = getattr(getattr(meta, "model", None), "TENANT_PATH", None) or "org"
        first, *rest = path.split("__")
        target = attrs[first] if first in attrs else getattr(getattr(self, "instance", None), first, None)
        for part in rest:
            target = getattr(target, part, None)
        return target if hasattr(target, "is_operator") else None

    def validate(self, attrs):
        # Before the subclasses' own checks (they call super() first): a foreign row is refused exactly as a
        # missing one would be, not by whichever rule happens to look at it next.
        attrs = super().validate(attrs)  # type: ignore[misc]
        parent = getattr(self, "parent", None)
        if parent is not None and not (isinstance(parent, serializers.ListSerializer) and parent.parent is None):
            return attrs  # a nested row: its root checks it with the root's org
        principal = _principal(self)  # type: ignore[arg-type]
        org = self.target_org(attrs) if isinstance(attrs, dict) else None
        if principal is None or org is None or org.pk == principal.org_id:
            return attrs
        # Operator-only fields (placement on a fleet) are the operator's own choice, not the tenant's reference.
        own = set(getattr(getattr(self, "Meta", None), "operator_only_fields", ()))
        errors = _foreign_to(self, {k: v for k, v in attrs.items() if k not in own},  # type: ignore[arg-type]
                             scope_for(principal, org))
        if errors:
            raise serializers.ValidationError(errors)
        return attrs


class TenantModelSerializer(ActingForMixin, StrictFieldsMixin, serializers.ModelSerializer):
    """Base of every model serializer of the API: relation fields it builds are scoped by default.

    A ModelSerializer builds a PrimaryKeyRelatedField over *every* row for each foreign key it
    is not told about; here it builds a ScopedRelatedField, so a relation field added to `fields`
    later is safe without anyone remembering (tests/core/test_relation_scoping.py enforces it).
    Unknown and read-only fields in a write are refused by name (apps.core.api.strict).
    """

    serializer_related_field = ScopedRelatedField

    # Meta.operator_only_fields: only operators may set them (placement on fleets, `shared`); anyone
    # else may send them only with the value they already have.
    # Meta.create_only_fields: fixed once the object exists (a pool's LB: moving it would strand the
    # routes that target it on the old LB).

    def to_internal_value(self, data):
        meta = getattr(self, "Meta", None)
        principal = _principal(self)
        errors: dict[str, list[str]] = {}
        codes: dict[str, str] = {}
        if isinstance(data, dict):
            unchanged = set()
            if principal is not None and not principal.is_operator:
                for name in getattr(meta, "operator_only_fields", ()):
                    if name not in data:
                        continue
                    if self._unchanged(name, data[name]):
                        unchanged.add(name)
                    else:
                        errors[name] = ["Only an operator can set this field."]
                        codes[name] = "operator_only"
            if self.instance is not None:
                for name in getattr(meta, "create_only_fields", ()):
                    if name in data and not self._unchanged(name, data[name]):
                        errors[name] = ["This field cannot be changed once the object exists; create a new one."]
                        codes[name] = "immutable"
            if unchanged:
                # Sent back as read (a PUT): nothing to validate or write, and the caller may not even be able
                # to resolve the value (an operator's fleet).
                data = {k: v for k, v in data.items() if k not in unchanged}
        if errors:
            named = {k: [serializers.ErrorDetail(m, code=codes[k]) for m in v] for k, v in errors.items()}
            raise serializers.ValidationError({**self.strict_field_errors(data), **named})
        return super().to_internal_value(data)

    def _unchanged(self, name: str, value: Any) -> bool:
        field = self.fields.get(name)
        if field is None:
            return False
        if self.instance is not None and isinstance(field, serializers.RelatedField):
            # The id it already has (an operator's placement a customer cannot resolve) is unchanged as sent.
            current_pk = getattr(self.instance, f"{field.source}_id", None)
            if value is not None and current_pk is not None and str(value) == str(current_pk):
                return True
        try:
            new = field.run_validation(value)
        except serializers.ValidationError:
            return False
        if self.instance is not None:
            current = getattr(self.instance, field.source, None)
        else:
            model_field = self.Meta.model._meta.get_field(field.source)
            current = None if model_field.is_relation else model_field.get_default()
        return getattr(new, "pk", new) == getattr(current, "pk", current)
