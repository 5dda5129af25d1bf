from django.urls import path

from rollouts.api import views

app_name = "rollouts-api"

urlpatterns = [
    path("rollouts/", views.RolloutListView.as_view(), name="rollouts"),
    path("rollouts/<int:pk>/", views.RolloutDetailView.as_view(), name="rollout"),
    *[
        path(f"rollouts/<int:pk>/{action}/", views.RolloutActionView.as_view(action=action), name=action)
        for action in ("pause", "resume", "abort", "promote")
    ],
]
