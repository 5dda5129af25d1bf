"""Artifacts in the console: the versions × regions matrix of replicas, storage used, retrying a copy."""

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from artifacts import selectors
from artifacts.services import scheduling
from core.choices import Scope
from core.principal import Principal
from core.views import page


@page
def artifact_matrix(request: HttpRequest, p: Principal) -> HttpResponse:
    storage = selectors.storage_used(p) if p.may(Scope.REGIONS_WRITE) else None
    grid = selectors.matrix(selectors.replicas_for(p))
    return render(request, "artifacts/matrix.html", {"grid": grid, "storage": storage})


@require_POST
@page
def replica_retry(request: HttpRequest, p: Principal, pk: int) -> HttpResponse:
    replica = scheduling.replica_retry(actor=p, replica=selectors.replica_get(p, pk))
    messages.success(request, f"Replication of {replica} restarted.")
    return redirect("artifacts:matrix")
