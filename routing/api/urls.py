from django.urls import path

from routing.api import views

app_name = "routing-api"

urlpatterns = [
    path("routing/table/", views.RouteTableView.as_view(), name="table"),
    path("routing/gateway-config/", views.GatewayConfigView.as_view(), name="gateway-config"),
    path("routing/indexes/<slug:tenant>/<slug:name>/", views.GatewayIndexView.as_view(), name="index"),
    path("routing/export/nginx/", views.NginxExportView.as_view(), name="export-nginx"),
    path("routing/export/envoy/", views.EnvoyExportView.as_view(), name="export-envoy"),
    path("routing/export/gateway-api/", views.GatewayApiExportView.as_view(), name="export-gateway-api"),
    path("routing/health/", views.HealthView.as_view(), name="health"),
    path("routing/events/", views.EventsView.as_view(), name="events"),
    path("routing/what-if/", views.WhatIfView.as_view(), name="what-if"),
    path("routing/activations/", views.ActivationView.as_view(), name="activations"),
    path("routing/response-cache/", views.ResponseCacheListView.as_view(), name="response-caches"),
    path(
        "routing/response-cache/<str:tenant>/<str:model>/",
        views.ResponseCacheView.as_view(),
        name="response-cache",
    ),
]
