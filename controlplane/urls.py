from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from controlplane import health
from core.api.conventions import envelope

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("api/v1/", include("core.api.urls")),
    path("api/v1/", include("registry.api.urls")),
    path("api/v1/", include("regions.api.urls")),
    path("api/v1/", include("artifacts.api.urls")),
    path("api/v1/", include("routing.api.urls")),
    path("api/v1/", include("billing.api.urls")),
    path("api/v1/", include("rollouts.api.urls")),
    path("api/v1/", include("autoscaling.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("registry/", include("registry.dashboard_urls")),
    path("regions/artifacts/", include("artifacts.dashboard_urls")),
    path("regions/", include("regions.dashboard_urls")),
    # Under a deployment's address but mounted by the shell: regions may not import autoscaling.
    path("deployments/<slug:owner>/<slug:name>/autoscaling/", include("autoscaling.dashboard_urls")),
    path("deployments/", include("regions.deployment_urls")),
    path("routing/", include("routing.dashboard_urls")),
    path("costs/", include("billing.dashboard_urls")),
    path("rollouts/", include("rollouts.dashboard_urls")),
    path("", include("controlplane.console_urls")),
]


def _error(request: HttpRequest, status: int, code: str, message: str) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(envelope(code, message), status=status)
    return render(request, "error.html", {"status": status, "message": message}, status=status)


def handler404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _error(request, 404, "not_found", "Nothing lives at this address.")


def handler500(request: HttpRequest) -> HttpResponse:
    return _error(
        request, 500, "server_error", "The server failed to handle this request; it has been logged."
    )


def handler403(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _error(request, 403, "forbidden", str(exception) if exception else "You may not do this.")


def handler400(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    return _error(request, 400, "bad_request", "The request could not be understood.")
