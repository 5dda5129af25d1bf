from django.urls import path

from billing.api import views

app_name = "billing-api"

urlpatterns = [
    path("usage/", views.UsageIngestView.as_view(), name="usage"),
    path("usage/<str:request_id>/", views.UsageTraceView.as_view(), name="usage-trace"),
    path("prices/", views.PriceListView.as_view(), name="prices"),
    path("costs/", views.CostReportView.as_view(), name="costs"),
    path("costs/idle/", views.IdleView.as_view(), name="idle"),
    path("costs/crosscheck/", views.CrosscheckView.as_view(), name="crosscheck"),
    path("budgets/alerts/", views.BudgetAlertView.as_view(), name="budget-alerts"),
]
