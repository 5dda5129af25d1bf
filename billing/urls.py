from django.urls import path

from billing import api

app_name = "billing-api"

urlpatterns = [
    path("usage/", api.UsageIngestView.as_view(), name="usage"),
    path("usage/<str:request_id>/", api.UsageTraceView.as_view(), name="usage-trace"),
]
