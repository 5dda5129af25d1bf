from django.urls import path

from regions import views

app_name = "deployments"

urlpatterns = [
    path("", views.deployment_list, name="list"),
    path("new/", views.deployment_create, name="new"),
    path("<slug:owner>/<slug:name>/", views.deployment_detail, name="detail"),
    path("<slug:owner>/<slug:name>/scale/", views.deployment_scale, name="scale"),
    path("<slug:owner>/<slug:name>/delete/", views.deployment_delete, name="delete"),
]
