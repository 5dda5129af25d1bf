from django.urls import path

from billing import api

app_name = "billing-api"

urlpatterns = [
    path("usage/", api.UsageIngestView.as_view(), name="usage"),
    path("usage/<str:request_id>/", api.UsageTraceView.as_view(), name="usage-trace"),
    path("prices/", api.PriceListView.as_view(), name="prices"),
    path("costs/", api.CostReportView.as_view(), name="costs"),
    path("costs/idle/", api.IdleView.as_view(), name="idle"),
    path("costs/crosscheck/", api.CrosscheckView.as_view(), name="crosscheck"),
    path("budgets/alerts/", api.BudgetAlertView.as_view(), name="budget-alerts"),
]
