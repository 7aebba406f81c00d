from django.apps import AppConfig


class AcmeConfig(AppConfig):
    name = "apps.acme"
    label = "acme"
