from django.urls import path

from regions.api import views

app_name = "regions-api"
DEPLOYMENT = "deployments/<slug:owner>/<slug:name>/"

urlpatterns = [
    path("regions/", views.RegionListView.as_view(), name="regions"),
    path("regions/<str:code>/", views.RegionDetailView.as_view(), name="region"),
    path("regions/<str:code>/status/", views.RegionStatusView.as_view(), name="region-status"),
    path("deployments/", views.DeploymentListView.as_view(), name="deployments"),
    path("deployments/placement/", views.PlacementView.as_view(), name="placement"),
    path(DEPLOYMENT, views.DeploymentDetailView.as_view(), name="deployment"),
    path(DEPLOYMENT + "scale/", views.DeploymentScaleView.as_view(), name="scale"),
    path(DEPLOYMENT + "fallbacks/", views.DeploymentFallbacksView.as_view(), name="fallbacks"),
    path(DEPLOYMENT + "events/", views.DeploymentEventsView.as_view(), name="events"),
    path(DEPLOYMENT + "manifest/", views.DeploymentManifestView.as_view(), name="manifest"),
]
