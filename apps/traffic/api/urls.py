from django.urls import path

from apps.traffic.api import views


def register(router) -> None:
    """Traffic has no model endpoints; its paths are below."""


urlpatterns = [
    path("traffic/overflow/", views.OverflowView.as_view(), name="traffic-overflow"),
    path("traffic/what-if/", views.WhatIfView.as_view(), name="traffic-what-if"),
]
