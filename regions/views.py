"""Regions and deployments in the console: capacity, self-service deployment with placement reasons."""

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from controlplane import selectors as core_selectors
from controlplane.choices import Scope
from controlplane.errors import ApplicationError
from controlplane.principal import Principal
from controlplane.views import page
from regions import forms, selectors
from regions.api.views import manifests_of
from regions.choices import TargetStatus
from regions.drivers.factory import engine_of
from regions.models import DeploymentTarget, Region
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


def _deployable(p: Principal) -> list[ModelVersion]:
    allowed = (
        placement.OPERATOR_DEPLOYABLE if p.sees_all(Scope.DEPLOYMENTS_WRITE) else placement.TENANT_DEPLOYABLE
    )
    models = registry_selectors.models_for(p)
    return list(
        ModelVersion.objects.filter(model__in=models, status__in=allowed).select_related("model__owner")
    )


@page
def deployment_create(request: HttpRequest, p: Principal) -> HttpResponse:
    tenants = core_selectors.tenants_for(p, Scope.DEPLOYMENTS_WRITE)
    versions = {str(v.pk): v for v in _deployable(p)}
    data = request.POST if request.method == "POST" else request.GET
    owner = tenants.filter(slug=data.get("owner")).first() or tenants.first()
    version = versions.get(data.get("version", "")) or next(iter(versions.values()), None)
    raw_replicas = data.get("replicas", "")
    replicas = min(int(raw_replicas), 64) if raw_replicas.isdigit() and int(raw_replicas) > 0 else 1
    choices = _choices(owner, version, replicas) if owner and version else []
    form = forms.DeploymentForm(
        request.POST or None,
        owners=[(t.slug, t.slug) for t in tenants],
        versions=[(k, f"{v.model.ref} @ {v.version} ({v.status})") for k, v in versions.items()],
        regions=[(c.region.code, c.region.code) for c in choices if c.eligible],
        initial={"owner": owner.slug if owner else "", "version": str(version.pk) if version else ""},
    )
    if request.method == "POST" and form.is_valid() and owner and version:
        try:
            created = deployments.deployment_create(
                actor=p,
                owner=owner,
                name=form.cleaned_data["name"],
                model=version.model,
                version=version.version,
                regions=form.cleaned_data["regions"] or None,
                replicas=form.cleaned_data["replicas"],
            )
        except ApplicationError as exc:
            form.add_error(None, exc.message)
        else:
            messages.success(request, f"Deployment {created} created; the regions are converging.")
            return redirect("deployments:detail", owner=owner.slug, name=created.name)
    context = {"form": form, "choices": choices, "owner": owner, "version": version}
    return render(request, "regions/deployment_form.html", context, status=400 if form.errors else 200)


def _choices(owner: Any, version: ModelVersion, replicas: int) -> list[placement.RegionChoice]:
    try:
        gpu_type, gpu_count = placement.default_gpu(
            version, list(Region.objects.prefetch_related("gpu_pools"))
        )
    except ApplicationError:
        return []
    return placement.region_choices(
        tenant=owner, version=version, gpu_type=gpu_type, gpu_count=gpu_count, replicas=replicas
    )


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
