"""Regions and deployments in the console: capacity, self-service deployment with placement reasons."""

from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from core import selectors as core_selectors
from core.choices import Scope
from core.errors import ApplicationError
from core.models import Tenant
from core.principal import Principal
from core.views import page
from regions import forms, selectors
from regions.api.views import manifests_of
from regions.choices import TargetStatus
from regions.drivers.factory import engine_of
from regions.models import Deployment, DeploymentTarget, Region
from regions.services import deployments, placement, regions
from registry import selectors as registry_selectors
from registry.models import ModelVersion


def _capacity(region: Region) -> list[dict[str, Any]]:
    return [
        {"pool": pool, "used": selectors.gpus_in_use(region, pool.gpu_type)}
        for pool in region.gpu_pools.all()
    ]


@page
def region_list(request: HttpRequest, p: Principal) -> HttpResponse:
    cards = [
        {"region": r, "engine": engine_of(r), "capacity": _capacity(r)} for r in selectors.regions_for(p)
    ]
    return render(
        request, "regions/region_list.html", {"cards": cards, "can_manage": p.may(Scope.REGIONS_WRITE)}
    )


@page
def region_detail(request: HttpRequest, p: Principal, code: str) -> HttpResponse:
    region = selectors.region_get(p, code)
    targets = (
        DeploymentTarget.objects.filter(region=region, deployment__in=selectors.deployments_for(p))
        .exclude(status=TargetStatus.DELETED)
        .select_related("deployment__owner")
    )
    context = {
        "region": region,
        "engine": engine_of(region),
        "capacity": _capacity(region),
        "targets": targets,
        "can_manage": p.may(Scope.REGIONS_WRITE),
        "status_form": forms.RegionStatusForm(),
    }
    return render(request, "regions/region_detail.html", context)


@require_POST
@page
def region_status(request: HttpRequest, p: Principal, code: str) -> HttpResponse:
    region = selectors.region_get(p, code)
    form = forms.RegionStatusForm(request.POST)
    if form.is_valid():
        regions.region_set_status(actor=p, region=region, **form.cleaned_data)
        messages.success(request, f"Region {code} is now {form.cleaned_data['status']}.")
    return redirect("regions:region", code=code)


@page
def deployment_list(request: HttpRequest, p: Principal) -> HttpResponse:
    found = selectors.deployments_for(p).prefetch_related("targets__region")
    can_create = core_selectors.visible_tenant_ids(p, Scope.DEPLOYMENTS_WRITE) != set()
    return render(request, "regions/deployment_list.html", {"deployments": found, "can_create": can_create})


@dataclass
class _Pick:
    """What the new-deployment form offers the caller, what is picked (the request's choice, else the
    first option) and the placement preview of that pick."""

    owners: QuerySet[Tenant]
    versions: dict[str, ModelVersion]
    owner: Tenant | None
    version: ModelVersion | None
    choices: list[placement.RegionChoice]


def _pick(request: HttpRequest, p: Principal) -> _Pick:
    data = request.POST if request.method == "POST" else request.GET
    owners = core_selectors.tenants_for(p, Scope.DEPLOYMENTS_WRITE)
    versions = {str(v.pk): v for v in registry_selectors.deployable_versions(p)}
    owner = owners.filter(slug=data.get("owner")).first() or owners.first()
    version = versions.get(data.get("version", "")) or next(iter(versions.values()), None)
    return _Pick(owners, versions, owner, version, _preview(owner, version, data.get("replicas", "")))


def _preview(
    owner: Tenant | None, version: ModelVersion | None, raw_replicas: str
) -> list[placement.RegionChoice]:
    if owner is None or version is None:
        return []
    replicas = min(int(raw_replicas), 64) if raw_replicas.isdigit() and int(raw_replicas) > 0 else 1
    try:
        return placement.placement_preview(tenant=owner, version=version, replicas=replicas).choices
    except ApplicationError:
        return []


def _form(request: HttpRequest, pick: _Pick) -> forms.DeploymentForm:
    return forms.DeploymentForm(
        request.POST or None,
        owners=[(t.slug, t.slug) for t in pick.owners],
        versions=[(k, f"{v.model.ref} @ {v.version} ({v.status})") for k, v in pick.versions.items()],
        regions=[(c.region.code, c.region.code) for c in pick.choices if c.eligible],
        initial={
            "owner": pick.owner.slug if pick.owner else "",
            "version": str(pick.version.pk) if pick.version else "",
        },
    )


def _create(p: Principal, form: forms.DeploymentForm, pick: _Pick) -> Deployment | None:
    """The deployment the valid form asks for, or None (the refusal is on the form)."""
    if pick.owner is None or pick.version is None:
        return None
    try:
        return deployments.deployment_create(
            actor=p,
            owner=pick.owner,
            name=form.cleaned_data["name"],
            model=pick.version.model,
            version=pick.version.version,
            regions=form.cleaned_data["regions"] or None,
            replicas=form.cleaned_data["replicas"],
        )
    except ApplicationError as exc:
        form.add_error(None, exc.message)
        return None


@page
def deployment_create(request: HttpRequest, p: Principal) -> HttpResponse:
    pick = _pick(request, p)
    form = _form(request, pick)
    created = _create(p, form, pick) if request.method == "POST" and form.is_valid() else None
    if created is not None:
        messages.success(request, f"Deployment {created} created; the regions are converging.")
        return redirect("deployments:detail", owner=created.owner.slug, name=created.name)
    context = {"form": form, "choices": pick.choices, "owner": pick.owner, "version": pick.version}
    return render(request, "regions/deployment_form.html", context, status=400 if form.errors else 200)


@page
def deployment_detail(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    deployment = selectors.deployment_get(p, owner, name)
    targets = deployment.targets.select_related("region").exclude(status=TargetStatus.DELETED)
    settled = all(t.status in (TargetStatus.READY, TargetStatus.PAUSED, TargetStatus.FAILED) for t in targets)
    context = {
        "deployment": deployment,
        "targets": targets,
        "events": deployment.events.select_related("region")[:100],
        "manifests": manifests_of(deployment),
        "settled": settled,
        "can_change": p.may(Scope.DEPLOYMENTS_WRITE, deployment.owner_id) and deployment.state == "active",
    }
    return render(request, "regions/deployment_detail.html", context)


@require_POST
@page
def deployment_scale(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    deployment = selectors.deployment_get(p, owner, name)
    form = forms.ScaleForm(request.POST)
    if form.is_valid():
        deployments.deployment_scale(actor=p, deployment=deployment, replicas=form.cleaned_data["replicas"])
        messages.success(
            request, f"{deployment} scaled to {form.cleaned_data['replicas']} replica(s) per region."
        )
    return redirect("deployments:detail", owner=owner, name=name)


@require_POST
@page
def deployment_delete(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    deployment = deployments.deployment_delete(actor=p, deployment=selectors.deployment_get(p, owner, name))
    messages.success(request, f"{deployment} is being deleted.")
    return redirect("deployments:list")
