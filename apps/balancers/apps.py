from django.apps import AppConfig


class BalancersConfig(AppConfig):
    name = "apps.balancers"
    label = "balancers"
