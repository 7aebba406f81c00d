"""The /api/v1/ router. Each app contributes its viewsets through `register(router)` in api/urls.py."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from apps.core.discovery import app_modules


class Router(DefaultRouter):
    """Leaves out an action a viewset sets to None (`create = None` on run histories): the route then has no
    such method and the Allow header does not offer it, instead of a handler that always answers 405."""

    def get_method_map(self, viewset, method_map):
        return {method: action for method, action in super().get_method_map(viewset, method_map).items()
                if getattr(viewset, action, None) is not None}


router = Router()
extra_urls: list = []
for module in app_modules("api.urls"):
    module.register(router)
    extra_urls.extend(getattr(module, "urlpatterns", []))
