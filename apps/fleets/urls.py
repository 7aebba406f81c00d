from django.urls import path

from apps.fleets import views

urlpatterns = [
    path("fleets/", views.FleetListView.as_view(), name="fleet-list"),
    path("fleets/<int:pk>/", views.FleetDetailView.as_view(), name="fleet-detail"),
    path("fleets/<int:pk>/nodes/", views.FleetNodesPartial.as_view(), name="fleet-nodes"),
    path("fleets/<int:pk>/rollouts/", views.FleetRolloutsPartial.as_view(), name="fleet-rollouts"),
    path("fleets/<int:pk>/do/<slug:verb>/", views.FleetActionView.as_view(), name="fleet-action"),
    path("fleets/<int:pk>/revisions/<int:number>/", views.RevisionDetailView.as_view(), name="fleet-revision"),
    path("fleets/<int:pk>/revisions/<int:number>/rollout/", views.RevisionRolloutView.as_view(),
         name="fleet-revision-rollout"),
    path("fleets/rollouts/<int:pk>/", views.RolloutDetailView.as_view(), name="rollout-detail"),
    path("fleets/rollouts/<int:pk>/progress/", views.RolloutProgressPartial.as_view(), name="rollout-progress"),
    path("fleets/rollouts/<int:pk>/rollback/", views.RolloutRollbackView.as_view(), name="rollout-rollback"),
    path("fleets/lb/<int:pk>/preview/", views.LbPreviewView.as_view(), name="lb-preview-page"),
    path("fleets/lb/<int:pk>/push/", views.LbPushView.as_view(), name="lb-push"),
]
