"""Events page: the org's recent events, its subscriptions (add, send test event) and the delivery log."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render

from apps.core.errors import DomainError
from apps.core.ui import PrincipalView
from apps.events import services, types
from apps.events.models import Delivery, Event, Subscription


class EventsView(PrincipalView):
    def _can_write(self) -> bool:
        return self.principal.can_write and self.principal.role_at_least("editor")

    def _render(self, request, status: int = 200, **extra):
        events = list(self.scoped(Event).select_related("org")[:50])
        for event in events:  # a person reads the sentence and the figures, never a Python dict
            event.summary = types.summary(event.type, event.object_repr, event.data)
            event.fields = [(key, _plain(value)) for key, value in sorted(event.data.items())]
        return render(request, "events/events.html", {
            "events": events,
            "subscriptions": self.scoped(Subscription).select_related("org"),
            "deliveries": self.scoped(Delivery).select_related("event", "subscription")[:50],
            "types": sorted(set(types.TYPES) - {"test"}), "formats": Subscription.Format.values,
            "can_write": self._can_write(), **extra}, status=status)

    def get(self, request):
        return self._render(request)

    def post(self, request):
        if not self._can_write():
            return HttpResponse("Viewers cannot change subscriptions.", status=403)
        try:
            test_pk = request.POST.get("test", "")
            toggle = request.POST.get("toggle", "")
            if toggle:
                sub = self.get_changeable(Subscription, pk=int(toggle) if toggle.isdigit() else 0)
                services.subscription_save(principal=self.principal, subscription=sub,
                                           data={"enabled": not sub.enabled})
                now = "enabled: it sends on your authority now" if sub.enabled else "disabled"
                return self._render(request, notice=f"{sub.name} {now}.")
            if test_pk:
                sub = self.get_changeable(Subscription, pk=int(test_pk) if test_pk.isdigit() else 0)
                services.subscription_send_test(principal=self.principal, subscription=sub)
                return self._render(request, notice=f"Test event sent to {sub.name}; see the delivery log.")
            data = {"name": request.POST.get("name", "").strip()[:100], "url": request.POST.get("url", "").strip(),
                    "format": request.POST.get("format", "generic"), "types": request.POST.getlist("types")}
            if not data["name"]:
                raise DomainError("invalid_name", "Give the subscription a name.", field="name")
            if data["format"] not in Subscription.Format.values:
                raise DomainError("invalid_format", "Choose generic or slack.", field="format")
            services.subscription_save(principal=self.principal, subscription=Subscription(), data=data,
                                       secret=request.POST.get("secret", ""))
        except DomainError as exc:
            return self._render(request, status=400, error=exc.detail)
        return self._render(request, notice="Subscription added.")


def _plain(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_plain(v)}" for k, v in sorted(value.items())) or "—"
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value) or "—"
    return "—" if value is None else str(value)
