"""Fleet UI: fleets and nodes, revision history with diffs, live rollout progress, preview, rollback.

Operators see and act on everything. Customers see the fleets serving load balancers they can see,
their nodes' state and rollouts, never config text (a shared LB's config names other tenants).
"""

from __future__ import annotations

from django.core.cache import cache
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils.html import escape
from django_htmx.http import HttpResponseClientRedirect

from apps.balancers.models import LoadBalancer
from apps.core.errors import DomainError
from apps.core.ui import PrincipalView
from apps.fleets import selectors, services
from apps.fleets.config import preview
from apps.fleets.config.stored import diff_lines
from apps.fleets.health.collect import health_cache_key
from apps.fleets.models import ConfigRevision, Fleet, Node, NodeResult, Rollout, revision_deferred

RECENT_ROLLOUTS = 15
RECENT_REVISIONS = 30


class FleetAccessMixin:
    def visible_fleets(self):
        return selectors.fleets_visible_to(self.principal)

    def get_fleet(self, pk: int) -> Fleet:
        return get_object_or_404(self.visible_fleets().select_related("region"), pk=pk)

    def require_operator(self) -> None:
        if not self.principal.is_operator:
            raise Http404("Not found.")

    def fleet_context(self, fleet: Fleet) -> dict:
        nodes = list(Node.objects.filter(fleet=fleet).select_related("applied_revision")
                     .defer(*revision_deferred("applied_revision")).order_by("name"))
        health = cache.get(health_cache_key(fleet.pk)) or {}
        operator = self.principal.is_operator
        for index, node in enumerate(nodes, start=1):
            entry = health.get("nodes", {}).get(node.name, {})
            # A customer on a shared fleet sees how its nodes fare, not the operator's node names nor how
            # many servers other tenants run there.
            servers = entry.get("servers", []) if operator else []
            node.label = node.name if operator else f"node {index}"
            node.servers_up = sum(1 for s in servers if s.get("status") in ("UP", "no check"))
            node.servers_total = len(servers)
            node.on_desired = node.applied_revision is not None and node.applied_revision.number == (
                fleet.desired_revision)
        return {"fleet": fleet, "nodes": nodes, "is_operator": self.principal.is_operator,
                "health_at": _when(health.get("collected_at")), "pin": selectors.fleet_pin(fleet)}


class FleetListView(FleetAccessMixin, PrincipalView):
    def get(self, request):
        fleets = list(self.visible_fleets().select_related("region").order_by("name"))
        # Only the LBs the viewer may see: a shared fleet also serves other tenants' LBs.
        visible_lbs = set(LoadBalancer.objects.visible_to(self.principal).values_list("pk", flat=True))
        for fleet in fleets:
            nodes = list(fleet.nodes.filter(enabled=True).values_list("status", "applied_revision__number"))
            fleet.node_total = len(nodes)
            fleet.node_up = sum(1 for status, _ in nodes if status == Node.Status.UP)
            fleet.node_on_desired = sum(1 for _, number in nodes if number == fleet.desired_revision)
            fleet.problem_nodes = sum(1 for status, _ in nodes if status in (Node.Status.DOWN, Node.Status.DRIFTED))
            fleet.last_rollout = fleet.rollouts.order_by("-id").first()
            fleet.lbs = [lb.name for lb in selectors.fleet_lbs(fleet) if lb.pk in visible_lbs]
        return render(request, "fleets/list.html", {"fleets": fleets})


class FleetDetailView(FleetAccessMixin, PrincipalView):
    def get(self, request, pk: int):
        fleet = self.get_fleet(pk)
        context = self.fleet_context(fleet)
        context["rollouts"] = (fleet.rollouts.select_related("revision").defer(*revision_deferred("revision"))
                               .order_by("-id")[:RECENT_ROLLOUTS])
        context["lbs"] = selectors.fleet_lbs(fleet).filter(
            pk__in=LoadBalancer.objects.visible_to(self.principal).values("pk"))
        if self.principal.is_operator:
            context["revisions"] = fleet.revisions.defer(*revision_deferred()).order_by("-number")[:RECENT_REVISIONS]
            context["pending_changes"] = fleet.change_seq > fleet.rendered_seq
        return render(request, "fleets/detail.html", context)


class FleetNodesPartial(FleetAccessMixin, PrincipalView):
    """The nodes table alone: the fleet page polls it every few seconds."""

    def get(self, request, pk: int):
        return render(request, "fleets/_nodes.html", self.fleet_context(self.get_fleet(pk)))


class FleetRolloutsPartial(FleetAccessMixin, PrincipalView):
    def get(self, request, pk: int):
        fleet = self.get_fleet(pk)
        rollouts = (fleet.rollouts.select_related("revision").defer(*revision_deferred("revision"))
                    .order_by("-id")[:RECENT_ROLLOUTS])
        return render(request, "fleets/_rollouts.html", {"fleet": fleet, "rollouts": rollouts,
                                                         "is_operator": self.principal.is_operator})


def _said(message: str) -> HttpResponse:
    """An action's answer when it had nothing to start: shown beside the buttons."""
    return HttpResponse(escape(message))


class FleetActionView(FleetAccessMixin, PrincipalView):
    """Operator buttons on the fleet page: push held changes, converge, hold/auto."""

    def post(self, request, pk: int, verb: str):
        self.require_operator()
        fleet = self.get_fleet(pk)
        if not self.principal.can_deploy:
            return HttpResponse("Your role cannot deploy.", status=403)
        if verb == "push":
            rollout = services.fleet_push(fleet=fleet, principal=self.principal)
            if rollout is not None:
                return HttpResponseClientRedirect(reverse("rollout-detail", args=[rollout.pk]))
            fleet.refresh_from_db()
            latest = selectors.latest_revision(fleet)
            if latest is not None and not latest.validation_ok:
                return _said(f"Revision {latest.number} failed validation: nothing was pushed.")
            return _said(f"Nothing to push: revision {fleet.desired_revision} already holds every change.")
        elif verb == "converge":
            report = services.fleet_drift_report(fleet=fleet)
            rollout = services.fleet_converge(fleet=fleet, check_drift=False)
            if rollout is not None:
                return HttpResponseClientRedirect(reverse("rollout-detail", args=[rollout.pk]))
            return _said(report.summary() + ("" if report.skipped else " Nothing to converge."))
        elif verb == "confirm-restore":
            services.fleet_restore_confirm(fleet=fleet, principal=self.principal)
        elif verb in ("hold", "auto"):
            services.fleet_save(principal=self.principal, fleet=fleet, data={"auto_rollout": verb == "auto"})
        else:
            raise Http404("Unknown action.")
        return HttpResponseClientRedirect(reverse("fleet-detail", args=[fleet.pk]))


class RevisionDetailView(FleetAccessMixin, PrincipalView):
    def get(self, request, pk: int, number: int):
        self.require_operator()
        fleet = self.get_fleet(pk)
        revision = get_object_or_404(ConfigRevision, fleet=fleet, number=number)
        return render(request, "fleets/revision.html", {
            "fleet": fleet, "revision": revision, "diff": diff_lines(revision.diff),
            "is_desired": revision.number == fleet.desired_revision,
        })


class RevisionRolloutView(FleetAccessMixin, PrincipalView):
    """Roll the fleet out to this revision (a rollback when it is older than the desired one)."""

    def post(self, request, pk: int, number: int):
        self.require_operator()
        fleet = self.get_fleet(pk)
        if not self.principal.can_deploy:
            return HttpResponse("Your role cannot deploy.", status=403)
        try:
            rollout = services.fleet_rollback(fleet=fleet, number=number, principal=self.principal)
        except DomainError as exc:
            return HttpResponse(exc.detail, status=exc.status)
        return HttpResponseClientRedirect(reverse("rollout-detail", args=[rollout.pk]))


class RolloutMixin(FleetAccessMixin):
    def get_rollout(self, pk: int) -> Rollout:
        rollout = get_object_or_404(Rollout.objects.visible_to(self.principal).select_related(
            "fleet", "revision"), pk=pk)
        return rollout

    def rollout_context(self, rollout: Rollout) -> dict:
        results = list(rollout.results.select_related("node").order_by("node__name"))
        for index, result in enumerate(results, start=1):  # customers: positions, not the node names
            result.label = result.node.name if self.principal.is_operator else f"node {index}"
        done = sum(1 for r in results if r.status not in ("pending", "running"))
        # What the heading says: how many serve the revision, not how many are finished (a stopped rollout's
        # skipped and put-back nodes are finished too, and serve the revision before).
        count = {status: sum(1 for r in results if r.status == status) for status in NodeResult.Status.values}
        return {"rollout": rollout, "results": results, "done": done, "total": len(results), "count": count,
                "active": rollout.status in Rollout.ACTIVE, "is_operator": self.principal.is_operator}


class RolloutDetailView(RolloutMixin, PrincipalView):
    def get(self, request, pk: int):
        return render(request, "fleets/rollout.html", self.rollout_context(self.get_rollout(pk)))


class RolloutProgressPartial(RolloutMixin, PrincipalView):
    """Per-node progress; keeps polling itself while the rollout is active."""

    def get(self, request, pk: int):
        return render(request, "fleets/_rollout_progress.html", self.rollout_context(self.get_rollout(pk)))


class RolloutRollbackView(RolloutMixin, PrincipalView):
    def post(self, request, pk: int):
        self.require_operator()
        rollout = self.get_rollout(pk)
        if not self.principal.can_deploy:
            return HttpResponse("Your role cannot deploy.", status=403)
        try:
            new = services.rollout_rollback(rollout=rollout, principal=self.principal)
        except DomainError as exc:
            return HttpResponse(exc.detail, status=exc.status)
        return HttpResponseClientRedirect(reverse("rollout-detail", args=[new.pk]))


class LbPreviewView(PrincipalView):
    """Preview-before-push for a load balancer: GET the page, POST (htmx) computes the diff."""

    def lb(self, pk: int) -> LoadBalancer:
        return self.get_scoped(LoadBalancer, pk=pk)

    def get(self, request, pk: int):
        lb = self.lb(pk)
        fleets = list(selectors.lb_fleets(lb))
        return render(request, "fleets/lb_preview.html", {
            "lb": lb, "fleets": fleets, "can_push": self.can_push(lb),
            "held": [f for f in fleets if not f.auto_rollout]})

    def post(self, request, pk: int):
        lb = self.lb(pk)
        previews = preview.lb_preview(lb=lb, principal=self.principal)
        for entry in previews:
            entry["lines"] = diff_lines(entry.get("diff", ""))
        # `next`: where a push from this preview returns (the LB workspace shows its progress per node).
        return render(request, "fleets/_preview.html", {"lb": lb, "previews": previews, "can_push": self.can_push(lb),
                                                        "next": "workspace" if request.POST.get("next") == "workspace"
                                                        else ""})

    def can_push(self, lb: LoadBalancer) -> bool:
        return selectors.can_push(self.principal, lb)


class LbPushView(LbPreviewView):
    def post(self, request, pk: int):
        lb = self.lb(pk)
        if not self.can_push(lb):
            return HttpResponse("Only operators (or the owner of a dedicated LB) push.", status=403)
        started = [r for r in (services.fleet_push(fleet=f, principal=self.principal)
                               for f in selectors.lb_fleets(lb)) if r is not None]
        if request.POST.get("next") == "workspace":
            return HttpResponseClientRedirect(reverse("lb-detail", args=[lb.pk]))
        if len(started) == 1:
            return HttpResponseClientRedirect(reverse("rollout-detail", args=[started[0].pk]))
        return HttpResponseClientRedirect(reverse("lb-preview-page", args=[lb.pk]))


def _when(iso: str | None):
    """An ISO time stored in JSON (the health summary) as a datetime, for the `date`/`timesince` filters."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(iso) if iso else None
    except ValueError:
        return None
