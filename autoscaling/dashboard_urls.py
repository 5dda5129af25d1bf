"""The console's autoscaling pages, mounted under a deployment's page (controlplane/urls.py):
``/deployments/<owner>/<name>/autoscaling/``."""

from django.urls import path

from autoscaling import views

app_name = "autoscaling"

urlpatterns = [
    path("", views.autoscaling_page, name="page"),
    path("stop/", views.autoscaling_stop, name="stop"),
]
