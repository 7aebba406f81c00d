from django.urls import path

from apps.capacity import views

urlpatterns = [
    path("capacity/", views.CapacityIndexView.as_view(), name="capacity"),
    path("capacity/compare/", views.CapacityCompareView.as_view(), name="capacity-compare"),
    path("capacity/tests/<int:pk>/", views.CapacityTestDetailView.as_view(), name="capacity-test"),
    path("capacity/tests/<int:pk>/start/", views.CapacityTestStartView.as_view(), name="capacity-test-start"),
    path("capacity/runs/<int:pk>/", views.CapacityRunDetailView.as_view(), name="capacity-run"),
    path("capacity/runs/<int:pk>/progress/", views.CapacityRunProgressView.as_view(), name="capacity-run-progress"),
    path("capacity/runs/<int:pk>/cancel/", views.CapacityRunCancelView.as_view(), name="capacity-run-cancel"),
    path("capacity/runs/<int:pk>/apply/", views.CapacityRunApplyView.as_view(), name="capacity-run-apply"),
    path("capacity/runs/<int:pk>/chart.json", views.CapacityRunChartView.as_view(), name="capacity-run-chart"),
    path("capacity/pools/<int:pk>/drills/", views.PoolDrillsView.as_view(), name="pool-drills"),
    path("capacity/drills/<int:pk>/", views.DrillDetailView.as_view(), name="drill"),
    path("capacity/drills/<int:pk>/progress/", views.DrillProgressView.as_view(), name="drill-progress"),
    path("capacity/drills/<int:pk>/cancel/", views.DrillCancelView.as_view(), name="drill-cancel"),
    path("capacity/drills/<int:pk>/chart.json", views.DrillChartView.as_view(), name="drill-chart"),
]
