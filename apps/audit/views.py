"""Audit log page with filters; the table alone is re-rendered for htmx requests."""

from __future__ import annotations

from django.core.paginator import Paginator
from django.db.models import Q
from django.shortcuts import render

from apps.audit.models import AuditEvent
from apps.core.ui import PrincipalView


class AuditListView(PrincipalView):
    def get(self, request):
        events = self.scoped(AuditEvent).select_related("org")
        action = request.GET.get("action", "").strip()[:64]
        object_type = request.GET.get("object_type", "").strip()[:64]
        actor = request.GET.get("actor", "").strip()[:64]
        if action:
            events = events.filter(action__startswith=action)
        if object_type:
            events = events.filter(object_type=object_type)
        if actor:
            # "user:3" as stored, or a name as people read it ("alice", "ci-deploy", "acme").
            events = events.filter(Q(actor=actor) | Q(actor_label__icontains=actor))
        page = Paginator(events, 50).get_page(request.GET.get("page"))
        context = {"page": page, "action": action, "object_type": object_type, "actor": actor}
        return render(request, self.template_for("audit/list.html", "audit/table.html"), context)
