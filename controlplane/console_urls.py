"""The console's pages under one "dashboard" namespace: the fleet Overview (shell) and the core app's pages
(tenants, users, tokens, audit, operations)."""

from django.urls import path

from controlplane import overview
from core import dashboard_urls

app_name = "dashboard"

urlpatterns = [
    path("", overview.overview, name="overview"),
    *dashboard_urls.urlpatterns,
]
