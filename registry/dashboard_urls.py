from django.urls import path

from registry import views

app_name = "registry"

MODEL = "<slug:owner>/<slug:name>/"

urlpatterns = [
    path("", views.catalog, name="catalog"),
    path(MODEL, views.model_detail, name="model"),
    path(MODEL + "compare/", views.version_compare, name="compare"),
    path(MODEL + "rollback/", views.model_rollback, name="rollback"),
    path(MODEL + "<str:version>/", views.version_detail, name="version"),
    path(MODEL + "<str:version>/transition/", views.version_transition, name="transition"),
]
