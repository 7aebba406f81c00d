"""The real URLconf plus API views that fail, to test how the API answers a bug."""

from django.http import HttpRequest, HttpResponse
from django.urls import path
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.urls import handler404, handler500  # noqa: F401
from controlplane.urls import urlpatterns as base


class Boom(APIView):
    def get(self, request) -> Response:
        raise RuntimeError("kaboom: an internal detail")


def plain_boom(request: HttpRequest) -> HttpResponse:  # outside DRF: Django's handler500 answers
    raise RuntimeError("kaboom: an internal detail")


urlpatterns = [path("api/v1/boom/", Boom.as_view()), path("api/v1/plain-boom/", plain_boom), *base]
