"""The LB workspace's listeners: attach or detach a static IP (a floating VIP), and VIP -> holder -> health.

Who holds a VIP is read from the nodes themselves (apps.fleets.health.vips, over each node's transport), so the
page loads that cell lazily with htmx instead of making every workspace view wait on SSH.
"""

from __future__ import annotations

from django.http import Http404, HttpResponse
from django.shortcuts import render

from apps.balancers.models import Listener, LoadBalancer, StaticIP
from apps.balancers.services import listener_static_ip_set
from apps.core.errors import DomainError
from apps.core.tenancy import Action
from apps.core.ui import PrincipalView, errors_of
from apps.fleets.selectors import listener_vip
from frontend.workspace import WorkspaceMixin


class ListenerStaticIpView(WorkspaceMixin, PrincipalView):
    """POST static_ip=<id> attaches, static_ip="" detaches; answers the listeners partial."""

    def post(self, request, pk: int):
        listener = self.get_changeable(Listener, pk=pk)  # foreign: 404
        if not self.principal.can_write:
            return HttpResponse("Your role cannot attach or detach addresses.", status=403)
        lb = listener.lb
        raw = request.POST.get("static_ip", "").strip()
        static_ip = None
        errors: dict[str, list[str]] = {}
        if raw:
            # Only addresses the principal may use: another org's VIP answers like a missing one.
            static_ip = self.scoped(StaticIP, Action.USE).filter(pk=raw).first() if raw.isdigit() else None
            if static_ip is None:
                errors = {"static_ip": ["Choose a static IP reserved for this load balancer's organization."]}
        if not errors:
            try:
                listener_static_ip_set(principal=self.principal, listener=listener, static_ip=static_ip)
            except DomainError as exc:
                errors = errors_of(exc)
        return render(request, "partials/listeners.html", self.listeners_context(lb, errors),
                      status=422 if errors else 200)


class ListenerVipView(WorkspaceMixin, PrincipalView):
    """The VIP cell of one listener: per serving fleet, the node(s) holding the address and their health."""

    def get(self, request, pk: int):
        listener = self.get_scoped(Listener, pk=pk)
        lb: LoadBalancer = listener.lb
        if not self.can_manage(lb):
            raise Http404
        rows = listener_vip(listener)
        return render(request, "partials/listener_vip.html", {"listener": listener, "rows": rows})
