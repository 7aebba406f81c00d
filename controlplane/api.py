"""The /api/v1/ router. Each app contributes its viewsets through `register(router)` in api/urls.py."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from apps.core.discovery import app_modules

router = DefaultRouter()
extra_urls: list = []
for module in app_modules("api.urls"):
    module.register(router)
    extra_urls.extend(getattr(module, "urlpatterns", []))
