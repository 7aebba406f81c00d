from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from controlplane.api import extra_urls, router
from controlplane.views import healthz, metrics

urlpatterns = [
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view loads its init script from ?script instead of inlining it: the CSP forbids inline script.
    path("api/v1/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="swagger-ui"),
    path("api/v1/", include(extra_urls)),
    path("api/v1/", include(router.urls)),
    path("metrics", metrics, name="metrics"),
    path("healthz", healthz, name="healthz"),
    # Browsers ask for /favicon.ico whatever the page links: answer it instead of a 404 on every page.
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("", include("frontend.urls")),
]

handler404 = "controlplane.views.error_404"
handler500 = "controlplane.views.error_500"
