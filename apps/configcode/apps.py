from django.apps import AppConfig


class ConfigcodeConfig(AppConfig):
    name = "apps.configcode"
    label = "configcode"
