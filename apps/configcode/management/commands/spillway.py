"""`manage.py spillway export|plan|apply` — config as code for pipelines.

    manage.py spillway export --org acme [FILE]     # YAML to FILE or stdout
    manage.py spillway plan FILE --org acme         # the changes applying FILE would make; exit 2 if any
                                  [--json]        # as JSON instead of one line a change
    manage.py spillway apply FILE --org acme        # all-or-nothing; refused if the org changed since FILE's etag

Runs as the operator (the command has the database), through the same rules as the API.
"""

from __future__ import annotations

import json as jsonlib
import sys
from dataclasses import dataclass
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from apps.accounts.models import Organization, Role
from apps.accounts.principal import Principal
from apps.configcode import document, services
from apps.configcode.api.views import dump_yaml, load
from apps.configcode.selectors import org_export
from apps.core.errors import DomainError


@dataclass(frozen=True)
class CommandPrincipal(Principal):
    @property
    def actor(self) -> str:
        return "cli:spillway"

    @property
    def name(self) -> str:  # type: ignore[override]
        return "spillway command"


class Command(BaseCommand):
    help = "Export, plan or apply an organization's configuration as one YAML/JSON document."

    def add_arguments(self, parser) -> None:
        parser.add_argument("action", choices=["export", "plan", "apply"])
        parser.add_argument("file", nargs="?", help="document to read (plan/apply) or write (export; default stdout)")
        parser.add_argument("--org", required=True, help="organization slug")
        parser.add_argument("--json", action="store_true", help="print the changes as JSON (for other programs)")

    def handle(self, *args, action: str, file: str | None, org: str, json: bool = False, **options) -> None:
        as_json = json
        target = Organization.objects.filter(slug=org).first()
        if target is None:
            raise CommandError(f"no organization {org!r}")
        if action == "export":
            text = dump_yaml(org_export(target))
            if file:
                Path(file).write_text(text)
            else:
                self.stdout.write(text)
            return
        if not file:
            raise CommandError(f"{action} needs a FILE")
        try:
            doc = load(Path(file).read_text())
            if action == "plan":
                current, changes = services.org_plan(org=target, doc=doc)
                etag = doc.get("etag") if isinstance(doc, dict) else None
                if etag and etag != current["etag"]:
                    self.stderr.write(self.style.WARNING(
                        f"warning: {org} changed since this file was exported (its etag {etag}, now "
                        f"{current['etag']}): the plan shows your edits against today's state, but apply will be "
                        "refused. Export again, re-apply your edit, then plan."))
            else:
                changes = services.org_apply(request=self._request(), org=target, doc=doc, if_match=None)
        except (document.DocumentError, DomainError) as exc:
            raise CommandError(f"{exc.code}: {getattr(exc, 'message', None) or exc}") from None
        if as_json:
            self.stdout.write(jsonlib.dumps([c.as_dict() for c in changes], indent=2, default=str))
        else:
            for change in changes:
                self.stdout.write(_line(change))
        self.stderr.write(f"{len(changes)} change(s){' applied' if action == 'apply' else ''}")
        if action == "plan" and changes:
            sys.exit(2)

    def _request(self) -> Request:
        operator = Organization.objects.filter(kind=Organization.Kind.OPERATOR).order_by("pk").first()
        if operator is None:
            raise CommandError("no operator organization to act as")
        raw = APIRequestFactory().post("/api/v1/apply/")
        raw.principal = CommandPrincipal(org=operator, role=Role.OWNER)
        return Request(raw)


_SIGNS = {"create": "+", "update": "~", "delete": "-"}


def _line(change: document.Change) -> str:
    """One change as a person reads a plan: `~ update members web/api/m1: weight 100 -> 50`."""
    key = "/".join(str(v) for v in change.key.values())
    if change.action == "update":
        fields = "; ".join(f"{name} {_short(v['spillway'])} -> {_short(v['file'])}"
                           for name, v in change.fields.items())
        return f"{_SIGNS['update']} update {change.kind} {key}: {fields}"
    return f"{_SIGNS[change.action]} {change.action} {change.kind} {key} ({change.side})"


def _short(value) -> str:
    text = jsonlib.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."
