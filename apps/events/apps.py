from django.apps import AppConfig


class EventsConfig(AppConfig):
    name = "apps.events"
    label = "events"

    def ready(self) -> None:
        from apps.core import lifecycle, quotas
        from apps.events.models import Subscription
        from apps.events.services import subscriptions_stop_for

        lifecycle.register(Subscription, stop=subscriptions_stop_for)
        quotas.count_with("event_subscriptions", lambda org: Subscription.objects.filter(org=org).count())
