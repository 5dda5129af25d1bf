from django.urls import path

from registry.api import views

app_name = "registry-api"

MODEL = "models/<slug:owner>/<slug:name>/"
VERSION = MODEL + "versions/<str:version>/"
PIPELINE = "pipelines/<slug:owner>/<slug:name>/"
PIPELINE_VERSION = PIPELINE + "versions/<str:version>/"
INDEX = "indexes/<slug:owner>/<slug:name>/"

urlpatterns = [
    path("engine-arguments/", views.EngineArgumentsView.as_view(), name="engine-arguments"),
    path("models/", views.ModelListView.as_view(), name="models"),
    path(MODEL, views.ModelDetailView.as_view(), name="model"),
    path(MODEL + "versions/", views.VersionListView.as_view(), name="versions"),
    path(MODEL + "diff/", views.DiffView.as_view(), name="diff"),
    path(MODEL + "rollback/", views.RollbackView.as_view(), name="rollback"),
    path(MODEL + "aliases/", views.AliasListView.as_view(), name="aliases"),
    path(MODEL + "aliases/<slug:alias>/", views.AliasDetailView.as_view(), name="alias"),
    path(MODEL + "aliases/<slug:alias>/history/", views.AliasHistoryView.as_view(), name="alias-history"),
    path(VERSION, views.VersionDetailView.as_view(), name="version"),
    path(VERSION + "transitions/", views.TransitionView.as_view(), name="transitions"),
    path(VERSION + "reports/", views.ReportView.as_view(), name="reports"),
    path(VERSION + "lineage/", views.LineageView.as_view(), name="lineage"),
    path("indexes/", views.IndexListView.as_view(), name="indexes"),
    path(INDEX, views.IndexDetailView.as_view(), name="index"),
    path(INDEX + "documents/", views.IndexDocumentsView.as_view(), name="index-documents"),
    path(INDEX + "documents/<str:key>/", views.IndexDocumentView.as_view(), name="index-document"),
    path("pipelines/", views.PipelineListView.as_view(), name="pipelines"),
    path(PIPELINE, views.PipelineDetailView.as_view(), name="pipeline"),
    path(PIPELINE + "versions/", views.PipelineVersionListView.as_view(), name="pipeline-versions"),
    path(PIPELINE_VERSION, views.PipelineVersionDetailView.as_view(), name="pipeline-version"),
    path(
        PIPELINE_VERSION + "transitions/", views.PipelineTransitionView.as_view(), name="pipeline-transitions"
    ),
]
