from apps.audit.api.views import AuditEventViewSet


def register(router) -> None:
    router.register("audit-events", AuditEventViewSet, basename="audit-event")
