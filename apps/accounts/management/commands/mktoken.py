"""Print a new API token for an org (bootstrapping deploy pipelines)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from apps.accounts.models import Organization
from apps.accounts.services import token_create
from apps.core.errors import DomainError


class Command(BaseCommand):
    help = "Create an API token: mktoken --org SLUG --scopes read,write [--user NAME] [--name NAME]"

    def add_arguments(self, parser) -> None:
        parser.add_argument("--org", required=True)
        parser.add_argument("--scopes", required=True, help="comma-separated: read,write,deploy")
        parser.add_argument("--user", default=None)
        parser.add_argument("--name", default="cli")

    def handle(self, *args, **opts) -> None:
        org = Organization.objects.filter(slug=opts["org"]).first()
        if org is None:
            raise CommandError(f"No organization with slug {opts['org']!r}.")
        user = None
        if opts["user"]:
            user = get_user_model().objects.filter(username=opts["user"]).first()
            if user is None:
                raise CommandError(f"No user named {opts['user']!r}.")
        scopes = [s.strip() for s in opts["scopes"].split(",") if s.strip()]
        try:
            issued = token_create(org=org, name=opts["name"], scopes=scopes, user=user)
        except DomainError as exc:
            raise CommandError(exc.detail) from exc
        self.stdout.write(issued.secret)
