from django.urls import path

from routing import api

app_name = "routing-api"

urlpatterns = [
    path("routing/table/", api.RouteTableView.as_view(), name="table"),
    path("routing/gateway-config/", api.GatewayConfigView.as_view(), name="gateway-config"),
    path("routing/export/nginx/", api.NginxExportView.as_view(), name="export-nginx"),
    path("routing/health/", api.HealthView.as_view(), name="health"),
    path("routing/events/", api.EventsView.as_view(), name="events"),
    path("routing/what-if/", api.WhatIfView.as_view(), name="what-if"),
]
