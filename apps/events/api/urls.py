from apps.events.api import views


def register(router) -> None:
    router.register("events", views.EventViewSet, basename="event")
    router.register("event-subscriptions", views.SubscriptionViewSet, basename="event-subscription")
    router.register("event-deliveries", views.DeliveryViewSet, basename="event-delivery")
