from django.urls import path

from apps.events import views

urlpatterns = [
    path("events/", views.EventsView.as_view(), name="events"),
]
