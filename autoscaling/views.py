"""Autoscaling in the console, under a deployment's page: its policy form, each region's replicas, signals
and timeline, and the last decisions with their reasons. Reads go through ``autoscaling.selectors`` and
``autoscaling.console``; writes through ``autoscaling.services.policies``, the API's own service."""

from datetime import datetime
from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from autoscaling import console, selectors
from autoscaling.forms import PolicyForm, initial_of
from autoscaling.services import policies
from core.choices import Scope
from core.errors import NotFound, ValidationFailed
from core.principal import Principal
from core.views import page
from regions import selectors as regions_selectors
from regions.models import Deployment


def clock() -> datetime:
    """The page's notion of now (the timeline ends here); tests replace it, never the wall clock."""
    return timezone.now()


def _saved(p: Principal, deployment: Deployment, form: PolicyForm) -> bool:
    """Set the policy from a valid form; False with the refusal placed on the form (nothing written)."""
    try:
        policies.policy_set(actor=p, deployment=deployment, body=form.body())
    except ValidationFailed as exc:
        form.refuse(exc)
        return False
    return True


def _context(p: Principal, deployment: Deployment, request: HttpRequest) -> dict[str, Any]:
    scaling = selectors.scaling_of(p, deployment)
    now, metric = clock(), request.GET.get("metric", "")
    return {
        "deployment": deployment,
        "policy": scaling["policy"],
        "targets": console.targets_of(scaling["policy"]),
        "regions": [
            console.region_view(r, scaling["policy"], now=now, requested=metric)
            for r in sorted(scaling["regions"], key=lambda r: r.region)
        ],
        "decisions": scaling["decisions"],
        "capacity_limited": selectors.capacity_limited(deployment),
        "can_change": p.may(Scope.DEPLOYMENTS_WRITE, deployment.owner_id),
        "now": now,
    }


@require_http_methods(["GET", "HEAD", "POST"])
@page
def autoscaling_page(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    """GET shows; POST sets the policy (a read-only caller gets the 403 page, which says what is missing)."""
    deployment = regions_selectors.deployment_get(p, owner, name)
    context = _context(p, deployment, request)
    form = None
    if request.method == "POST":
        p.require(Scope.DEPLOYMENTS_WRITE, deployment.owner_id)
        form = PolicyForm(request.POST)
        if form.is_valid() and _saved(p, deployment, form):
            messages.success(request, f"The autoscaling policy of {deployment} is saved.")
            return redirect("autoscaling:page", owner=owner, name=name)
    elif context["can_change"]:
        form = PolicyForm(initial=initial_of(context["policy"]))
    context["form"] = form
    status = 400 if form is not None and form.refused else 200
    return render(request, "autoscaling/autoscaling.html", context, status=status)


@require_POST
@page
def autoscaling_stop(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    """Remove the policy: the replicas stay where they are, the decisions stay in the log."""
    deployment = regions_selectors.deployment_get(p, owner, name)  # another tenant's: 404, as on GET
    try:
        policies.policy_delete(actor=p, deployment=deployment)
    except NotFound:  # stopped already (another tab, another person): say so on the page
        messages.info(request, f"{deployment} has no autoscaling policy to stop.")
    else:
        messages.success(request, f"Autoscaling of {deployment} stopped; its replicas stay as they are.")
    return redirect("autoscaling:page", owner=owner, name=name)
