from django.apps import AppConfig


class TrafficConfig(AppConfig):
    name = "apps.traffic"
    label = "traffic"
