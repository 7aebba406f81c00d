"""Forms for fleets' nodes (add, move, decommission) and certificates (upload), each a ServiceFormView over
the API's serializer and service (frontend/forms.py: the balancers' ones; frontend/forms_cloud.py: cloud)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import QueryDict
from django.shortcuts import redirect
from django.urls import reverse

from apps.accounts.models import Organization
from apps.balancers import services as balancer_services
from apps.balancers.api.serializers import LoadBalancerSerializer
from apps.balancers.models import LoadBalancer, Region
from apps.core.service_forms import FormField, ServiceFormView
from apps.core.ui import PrincipalView
from apps.fleets import services as fleet_services
from apps.fleets.api.serializers import CertificateSerializer, FleetSerializer, NodeSerializer
from apps.fleets.models import Certificate, Fleet, Node


def _fleets(view) -> list[tuple[str, str]]:
    return [(f.name, f.name) for f in view.scoped(Fleet).order_by("name")]


NODE_FIELDS = (
    FormField("fleet", "Fleet", "select", choices=_fleets, help="Moving a node to another fleet re-renders both."),
    FormField("name", "Name", placeholder="edge-3"),
    FormField("address", "Address", placeholder="127.0.0.1", help="Where the node's HAProxy is reached."),
    FormField("bind_address", "Bind address", nullable=True, help="Blank: the address above."),
    FormField("transport", "Transport", "select", choices=lambda v: Node.Transport.choices),
    FormField("runtime_dir", "Runtime directory", placeholder="/run/spillway/edge-3"),
    FormField("config_dir", "Config directory", placeholder="/etc/spillway/edge-3"),
    FormField("ssh_host", "SSH host"),
    FormField("ssh_port", "SSH port", "number", placeholder="22"),
    FormField("ssh_user", "SSH user", placeholder="root"),
    FormField("ssh_private_key", "SSH private key", "textarea", help="Stored encrypted; never shown again."),
    FormField("ssh_known_hosts", "SSH known hosts", "textarea", help="The node's pinned host key line."),
    FormField("health_port", "Health port", "number", nullable=True,
              help="Upstream load balancers, DNS or anycast check GET /spillway/healthz here: 200 in service, "
                   "503 drained. Blank: no health endpoint (a drain then only moves VIPs)."),
    FormField("enabled", "Enabled (takes rollouts)", "checkbox"),
)


class NodeFormView(ServiceFormView):
    """Add a node to a fleet, or move one (another fleet, address or transport): the operator's."""

    operator_only = True
    serializer_class = NodeSerializer
    model = Node
    fields = NODE_FIELDS

    @property
    def title(self) -> str:  # type: ignore[override]
        return "Edit node" if self.kwargs.get("pk") else "Add a node"

    def initial(self, obj):
        if obj is None:
            fleet = self.request.GET.get("fleet", "")
            return {"enabled": True, "transport": "local", "fleet": fleet}
        values = super().initial(obj)
        values.pop("ssh_private_key", None)
        return values

    def form_data(self, post: QueryDict, obj) -> dict[str, Any]:
        data = super().form_data(post, obj)
        if obj is not None and not post.get("ssh_private_key", "").strip():
            data.pop("ssh_private_key", None)  # blank on edit: keep the stored key
        return data

    def save(self, obj, data):
        return fleet_services.node_save(principal=self.principal, node=obj or Node(), data=data)

    def success_url(self, obj) -> str:
        return reverse("fleet-detail", args=[obj.fleet_id]) + f"#node-{obj.pk}"


class NodeDecommissionView(PrincipalView):
    """Remove a node from its fleet (the fleet's remaining nodes keep serving; its processes are stopped)."""

    http_method_names = ["post"]

    def post(self, request, pk: int):
        if not self.principal.is_operator or not self.principal.can_write:
            raise PermissionDenied("Only the operator decommissions nodes.")
        node = self.get_changeable(Node, pk=pk)
        fleet_id = node.fleet_id
        fleet_services.node_delete(principal=self.principal, node=node)
        return redirect(reverse("fleet-detail", args=[fleet_id]))


class NodeStateView(PrincipalView):
    """Take a node out of service or put it back, from its row on the fleet page:

    - drain: its health endpoint answers 503 (upstreams stop choosing it; what is open finishes) and its VIPs
      move to a peer. A map entry on the node: no reload;
    - maintenance: drained, and out of rollouts (enabled off) so it can be worked on or rebooted; the drain
      reaches the node first;
    - in service: enabled and undrained again (a maintenance node first converges to the desired revision).
    """

    http_method_names = ["post"]
    STATES = ("drain", "maintenance", "in-service")

    def post(self, request, pk: int, state: str):
        if not self.principal.is_operator or not self.principal.can_write:
            raise PermissionDenied("Only the operator drains nodes.")
        if state not in self.STATES:
            raise PermissionDenied("Unknown node state.")
        node = self.get_changeable(Node, pk=pk)
        fleet_services.node_set_service(principal=self.principal, node=node, state=state)
        return redirect(reverse("fleet-detail", args=[node.fleet_id]) + f"#node-{node.pk}")


class CertificateUploadView(ServiceFormView):
    """Upload (or replace) a certificate and its key; its expiry and users show on the certificates page."""

    serializer_class = CertificateSerializer
    model = Certificate
    fields = (
        FormField("name", "Name", placeholder="shop-example-com", create_only=True),
        FormField("cert_pem", "Certificate (PEM, leaf first, chain may follow)", "textarea"),
        FormField("key_pem", "Private key (PEM)", "textarea", help="Stored encrypted; never shown again."),
        FormField("chain_pem", "Chain (PEM, optional)", "textarea"),
    )

    @property
    def title(self) -> str:  # type: ignore[override]
        return "Replace certificate" if self.kwargs.get("pk") else "Upload a certificate"

    def initial(self, obj):
        return {"name": obj.name} if obj is not None else {}

    def save(self, obj, data):
        cert = obj or Certificate()
        return fleet_services.certificate_save(
            principal=self.principal, cert=cert, org=data.get("org") or (cert.org if cert.pk else self.principal.org),
            name=data.get("name", cert.name), cert_pem=data.get("cert_pem"), key_pem=data.get("key_pem"),
            chain_pem=data.get("chain_pem", ""))

    def success_url(self, obj) -> str:
        return reverse("certificates")


def _regions(view) -> list[tuple[str, str]]:
    return [(r.slug, r.slug) for r in Region.objects.order_by("slug")]


class FleetFormView(ServiceFormView):
    """A fleet: the HAProxy nodes of one region that serve LBs (nodes are added on its page)."""

    operator_only = True
    serializer_class = FleetSerializer
    model = Fleet
    fields = (
        FormField("name", "Name", placeholder="edge-us"),
        FormField("region", "Region", "select", choices=_regions),
        FormField("auto_rollout", "Roll changes out automatically", "checkbox"),
    )

    @property
    def title(self) -> str:  # type: ignore[override]
        return "Edit fleet" if self.kwargs.get("pk") else "New fleet"

    def initial(self, obj):
        return super().initial(obj) if obj is not None else {"auto_rollout": True}

    def save(self, obj, data):
        return fleet_services.fleet_save(principal=self.principal, fleet=obj or Fleet(), data=data)

    def success_url(self, obj) -> str:
        return reverse("fleet-detail", args=[obj.pk])


class LoadBalancerFormView(ServiceFormView):
    """A load balancer. Customers create their own (the operator places it on a fleet); the operator
    names its organization, its fleet and whether it is shared."""

    serializer_class = LoadBalancerSerializer
    model = LoadBalancer
    submit = "Save load balancer"

    @property
    def title(self) -> str:  # type: ignore[override]
        return "Edit load balancer" if self.kwargs.get("pk") else "New load balancer"

    def visible_fields(self, obj):
        fields = [FormField("name", "Name", placeholder="shop")]
        if self.principal.is_operator:
            fields += [
                FormField("org", "Organization", "select", create_only=True,
                          choices=lambda v: [(o.slug, o.slug) for o in v.scoped(Organization).order_by("slug")]),
                FormField("fleet", "Fleet", "select", blank_choice="none yet", nullable=True,
                          choices=lambda v: [(f.pk, f.name) for f in v.scoped(Fleet).order_by("name")]),
                FormField("shared", "Shared (customers may add their own routes and pools)", "checkbox"),
            ]
        return [f for f in fields if obj is None or not f.create_only]

    def initial(self, obj):
        if obj is None:
            return {"org": self.principal.org.slug}
        return super().initial(obj)

    def save(self, obj, data):
        return balancer_services.object_save(principal=self.principal, obj=obj or LoadBalancer(),
                                             action="update" if obj is not None else "create", data=data)

    def success_url(self, obj) -> str:
        return reverse("lb-detail", args=[obj.pk])
