from django.urls import path

from apps.traffic import views

urlpatterns = [
    path("traffic/", views.TrafficIndexView.as_view(), name="traffic"),
    path("traffic/pools/<int:pk>/", views.PoolTrafficView.as_view(), name="traffic-pool"),
    path("traffic/pools/<int:pk>/panel/", views.PoolPanelView.as_view(), name="traffic-pool-panel"),
    path("traffic/pools/<int:pk>/what-if/", views.PoolWhatIfView.as_view(), name="traffic-pool-what-if"),
]
