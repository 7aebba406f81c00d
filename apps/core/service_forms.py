"""One generic UI form for every object a person manages: serializer -> service -> inline errors.

The API's serializer validates (the same strict allowlists, scoped references and error codes), the
same service the API calls writes (audited, LB revision bumped), and what either refuses comes back next
to its field with status 422. A concrete form names its serializer, fields, service and where to go
after saving; it writes no template and no validation of its own.

Tenancy as in the API: a new object's references resolve only among rows the principal may use (the
serializer's scoped fields), an existing object is found with `get_changeable` (404 when not visible,
403 when visible but not changeable), and `operator_only` forms answer 403 to everyone else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import models
from django.http import HttpResponse, HttpResponseRedirect, QueryDict
from django.shortcuts import render
from django_htmx.http import HttpResponseClientRedirect

from apps.core.errors import DomainError
from apps.core.ui import PrincipalView, errors_of


@dataclass(frozen=True)
class FormField:
    """One input. `kind`: text, number, select, checkbox, textarea. Blank inputs are left out of the
    request (the serializer's default applies), or sent as null when `nullable`."""

    name: str
    label: str
    kind: str = "text"
    help: str = ""
    placeholder: str = ""
    step: str = ""
    nullable: bool = False
    create_only: bool = False  # shown when creating; fixed afterwards (like the API's create_only_fields)
    choices: Callable[[Any], Iterable[tuple[Any, str]]] | None = None  # called with the view
    blank_choice: str = ""  # a first, empty option ("none")


@dataclass
class BoundField:
    spec: FormField
    value: str
    errors: list[str]
    options: list[tuple[str, str]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"f-{self.spec.name}"


class ServiceFormView(PrincipalView):
    serializer_class: type | None = None
    model: type[models.Model] | None = None
    fields: tuple[FormField, ...] = ()
    operator_only = False
    title = ""
    submit = "Save"
    intro = ""
    extra_error_fields: tuple[str, ...] = ()  # shown by the form's extra template, not in the summary
    template_name = "core/service_form_page.html"
    partial_template = "core/service_form.html"

    # --- what a concrete form provides -------------------------------------------------------------

    def save(self, obj: models.Model | None, data: dict[str, Any]) -> models.Model:
        """Call the service (the API's) with the validated data; return the saved object."""
        raise NotImplementedError

    def success_url(self, obj: models.Model) -> str:
        raise NotImplementedError

    def fixed_data(self) -> dict[str, Any]:
        """Request fields that come from the URL, not the form (e.g. the LB a pool is created on)."""
        return {}

    def extra_data(self, post: QueryDict, errors: dict[str, list[str]]) -> dict[str, Any]:
        """Request fields built from more than one input (e.g. a pool's per-region capacity rows)."""
        return {}

    def extra_context(self) -> dict[str, Any]:
        return {}

    # --- the machinery -----------------------------------------------------------------------------

    def dispatch(self, request, *args, **kwargs):
        principal = getattr(request, "principal", None) if request.user.is_authenticated else None
        if self.operator_only and principal is not None and not principal.is_operator:
            raise PermissionDenied("Only the operator manages this.")
        return super().dispatch(request, *args, **kwargs)

    def get_object(self) -> models.Model | None:
        """The object edited (None when creating): changeable by the principal, or 404/403."""
        pk = self.kwargs.get("pk")
        if pk is None or self.model is None:
            return None
        return self.get_changeable(self.model, pk=pk)

    def get(self, request, **kwargs):
        obj = self.get_object()
        self.check_can_write()
        return self.render_form(obj, values=self.initial(obj), errors={})

    def post(self, request, **kwargs):
        obj = self.get_object()
        self.check_can_write()
        errors: dict[str, list[str]] = {}
        data = {**self.form_data(request.POST, obj), **self.extra_data(request.POST, errors),
                **(self.fixed_data() if obj is None else {})}
        serializer = self.serializer_class(instance=obj, data=data, partial=obj is not None,
                                           context={"request": request})
        if not errors:
            try:  # a serializer may ask a service (member addresses), which refuses with a DomainError
                if serializer.is_valid():
                    saved = self.save(obj, dict(serializer.validated_data))
                    url = self.success_url(saved)
                    return HttpResponseClientRedirect(url) if request.htmx else HttpResponseRedirect(url)
                errors = errors_of(serializer.errors)
            except DomainError as exc:
                errors = errors_of(exc)
        return self.render_form(obj, values=request.POST, errors=errors, status=422)

    def check_can_write(self) -> None:
        if not self.principal.can_write:
            raise PermissionDenied("Your role can read but not change this.")

    def visible_fields(self, obj: models.Model | None) -> list[FormField]:
        return [f for f in self.fields if obj is None or not f.create_only]

    def form_data(self, post: QueryDict, obj: models.Model | None) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for spec in self.visible_fields(obj):
            if spec.kind == "checkbox":
                data[spec.name] = post.get(spec.name, "") not in ("", "off", "false", "0")  # unchecked: absent
                continue
            raw = post.get(spec.name, "")
            raw = raw if spec.kind == "textarea" else raw.strip()
            if raw != "":
                data[spec.name] = raw
            elif spec.nullable:
                data[spec.name] = None
        return data

    def initial(self, obj: models.Model | None) -> dict[str, Any]:
        if obj is None:
            return {}
        represented = self.serializer_class(obj, context={"request": self.request}).data
        return {name: ("" if value is None else value) for name, value in represented.items()}

    def bound_fields(self, obj, values, errors) -> list[BoundField]:
        bound = []
        for spec in self.visible_fields(obj):
            value = values.get(spec.name, "") if hasattr(values, "get") else ""
            options = [(str(k), str(label)) for k, label in spec.choices(self)] if spec.choices else []
            bound.append(BoundField(spec=spec, value="" if value is None else str(value),
                                    errors=errors.get(spec.name, []), options=options))
        return bound

    def render_form(self, obj, *, values, errors: dict[str, list[str]], status: int = 200) -> HttpResponse:
        names = {f.name for f in self.visible_fields(obj)} | set(self.extra_error_fields)
        context = {
            "form_title": self.title, "object": obj, "submit": self.submit, "intro": self.intro,
            "fields": self.bound_fields(obj, values, errors), "values": values, "errors": errors,
            # Errors no input shows (a service's rule about the whole object, a fixed field's).
            "other_errors": [m for name, msgs in errors.items() if name not in names for m in msgs],
            "action": self.request.path, **self.extra_context(),
        }
        template = self.partial_template if getattr(self.request, "htmx", False) else self.template_name
        return render(self.request, template, context, status=status)
