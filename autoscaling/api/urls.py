from django.urls import path

from autoscaling.api import views

app_name = "autoscaling-api"

urlpatterns = [
    path("deployments/<slug:owner>/<slug:name>/autoscaling/", views.AutoscalingView.as_view(), name="policy"),
    path("scaling-decisions/", views.DecisionListView.as_view(), name="decisions"),
]
