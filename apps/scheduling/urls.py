from django.urls import path

from apps.scheduling import views

urlpatterns = [
    path("jobs/", views.JobListView.as_view(), name="jobs"),
    path("jobs/new/", views.JobFormView.as_view(), name="job-new"),
    path("jobs/preview/", views.SchedulePreviewView.as_view(), name="job-preview"),
    path("jobs/<int:pk>/", views.JobDetailView.as_view(), name="job"),
    path("jobs/<int:pk>/edit/", views.JobFormView.as_view(), name="job-edit"),
    path("jobs/<int:pk>/runs/", views.JobHistoryView.as_view(), name="job-history"),
    path("jobs/<int:pk>/run/", views.JobActionView.as_view(action="run"), name="job-run"),
    path("jobs/<int:pk>/pause/", views.JobActionView.as_view(action="pause"), name="job-pause"),
    path("jobs/<int:pk>/resume/", views.JobActionView.as_view(action="resume"), name="job-resume"),
    path("jobs/<int:pk>/delete/", views.JobActionView.as_view(action="delete"), name="job-delete"),
    path("job-runs/<int:pk>/cancel/", views.RunCancelView.as_view(), name="job-run-cancel"),
]
