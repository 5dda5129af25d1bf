from django.urls import path

from routing import views

app_name = "routing"

urlpatterns = [
    path("", views.routing, name="routing"),
    path("response-cache/", views.response_cache, name="response-cache"),
    path("pipelines/", views.pipelines, name="pipelines"),
    path("pipelines/<slug:owner>/<slug:name>/", views.pipeline_detail, name="pipeline"),
    path(
        "pipelines/<slug:owner>/<slug:name>/transition/",
        views.pipeline_transition,
        name="pipeline-transition",
    ),
]
