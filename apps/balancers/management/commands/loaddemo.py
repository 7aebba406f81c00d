"""Install the demo organizations, users, regions, shared LB and routes (idempotent)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from apps.balancers.demo import DEMO_PASSWORDS, load_demo
from apps.core.discovery import app_modules


class Command(BaseCommand):
    help = "Load the demo data set (idempotent)."

    def handle(self, *args, **opts) -> None:
        result = load_demo()
        # Later apps add to the demo (fleets: a local demo fleet) through a `load_demo()` of their own.
        for module in app_modules("demo"):
            if module.__name__ == "apps.balancers.demo":
                continue
            message = module.load_demo()
            if message:
                self.stdout.write(message)
        self.stdout.write(self.style.SUCCESS("Demo loaded."))
        self.stdout.write(f"  operator login: {result.admin_username} / {result.admin_password}")
        self.stdout.write(f"  customer logins: acme / {DEMO_PASSWORDS['acme']}, globex / {DEMO_PASSWORDS['globex']}")
