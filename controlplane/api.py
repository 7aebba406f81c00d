"""The /api/v1/ router. Each app contributes its viewsets through `register(router)` in api/urls.py."""

from __future__ import annotations

from importlib import import_module

from rest_framework.routers import DefaultRouter

API_APPS = ["accounts", "audit", "balancers", "fleets", "traffic", "capacity", "scheduling", "cloud"]

router = DefaultRouter()
extra_urls: list = []
for app in API_APPS:
    try:
        module = import_module(f"apps.{app}.api.urls")
    except ModuleNotFoundError as exc:
        if exc.name != f"apps.{app}.api.urls" and exc.name != f"apps.{app}.api":
            raise
        continue
    module.register(router)
    extra_urls.extend(getattr(module, "urlpatterns", []))
