from django.urls import path

from rollouts import views

app_name = "rollouts"

urlpatterns = [
    path("", views.rollout_list, name="list"),
    path("new/", views.rollout_new, name="new"),
    path("<int:pk>/", views.rollout_detail, name="detail"),
    *[
        path(f"<int:pk>/{action}/", views.rollout_action, {"action": action}, name=action)
        for action in views.ACTION_STATES
    ],
]
