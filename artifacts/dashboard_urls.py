from django.urls import path

from artifacts import views

app_name = "artifacts"

# Mounted at /regions/artifacts/ (before the regions pages, whose /regions/<code>/ would take the path).
urlpatterns = [
    path("", views.artifact_matrix, name="matrix"),
    path("<int:pk>/retry/", views.replica_retry, name="replica-retry"),
]
