from django.apps import AppConfig


class FleetsConfig(AppConfig):
    name = "apps.fleets"
    label = "fleets"
