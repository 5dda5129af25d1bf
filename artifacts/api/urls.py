from django.urls import path

from artifacts.api import views

app_name = "artifacts-api"

urlpatterns = [
    path("artifacts/replicas/", views.ReplicaListView.as_view(), name="replicas"),
    path("artifacts/replicas/<int:pk>/retry/", views.ReplicaRetryView.as_view(), name="replica-retry"),
    path("artifacts/matrix/", views.ReplicaMatrixView.as_view(), name="replica-matrix"),
    path("artifacts/storage/", views.StorageView.as_view(), name="storage"),
]
