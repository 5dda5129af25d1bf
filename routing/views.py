"""The routing page: the route table (with each route's response cache, which a tenant's members may
switch), endpoint health, the failover timeline and the what-if view; and the pipeline pages (each
stage's deployment, regions and health for a tenant)."""

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from core import selectors as core_selectors
from core.choices import Scope
from core.principal import Principal
from core.views import page
from regions import selectors as region_selectors
from registry import selectors as registry_selectors
from registry.choices import PipelineStatus
from registry.services import pipelines as pipeline_services
from routing import selectors, services
from routing.pipelines import pipeline_plan


class ResponseCacheForm(forms.Form):
    tenant = forms.SlugField(max_length=50)
    model = forms.CharField(max_length=40)
    ttl_seconds = forms.IntegerField(min_value=1, max_value=services.MAX_CACHE_TTL_SECONDS, required=False)
    action = forms.ChoiceField(choices=[("set", "set"), ("clear", "clear")])


@page
def routing(request: HttpRequest, p: Principal) -> HttpResponse:
    table = selectors.current() or services.publish()
    tenants = selectors.tenants_view(p, table.body.get("tenants", {}))
    rows = [
        {"tenant": slug, "model": name, "route": route}
        for slug, view in sorted(tenants.items())
        for name, route in sorted(view["models"].items())
    ]
    regions = [r.code for r in region_selectors.regions_for(p)]
    writable = {t.slug for t in core_selectors.tenants_for(p, None) if p.may(Scope.DEPLOYMENTS_WRITE, t.pk)}
    failed = request.GET.get("what_if", "")
    context = {
        "table": table,
        "rows": rows,
        "cache_writable": writable,
        "health": selectors.endpoint_health(p),
        "events": selectors.routing_events(p)[:50],
        "regions": regions,
        "what_if": failed if failed in regions else "",
        "impact": selectors.what_if(p, failed) if failed in regions else None,
    }
    return render(request, "routing/routing.html", context)


@require_POST
@page
def response_cache(request: HttpRequest, p: Principal) -> HttpResponse:
    """Switch a route's response cache on (with a TTL) or off, from the route table."""
    form = ResponseCacheForm(request.POST)
    if not form.is_valid():
        messages.error(
            request, "The response cache's TTL is a whole number of seconds, 1 to 604800 (a week)."
        )
        return redirect("routing:routing")
    data = form.cleaned_data
    tenant = core_selectors.tenant_get(p, data["tenant"], None)
    if data["action"] == "clear":
        services.response_cache_clear(actor=p, tenant=tenant, model_name=data["model"])
        messages.success(
            request, f"{tenant.slug}/{data['model']}: response cache off; its entries are deleted."
        )
    elif data["ttl_seconds"] is None:
        messages.error(request, "Give the response cache a TTL in seconds.")
    else:
        services.response_cache_set(
            actor=p, tenant=tenant, model_name=data["model"], ttl_seconds=data["ttl_seconds"]
        )
        messages.success(
            request,
            f"{tenant.slug}/{data['model']}: deterministic requests cached for {data['ttl_seconds']} s.",
        )
    return redirect("routing:routing")


class PipelineTransitionForm(forms.Form):
    version = forms.CharField(max_length=64)
    to = forms.ChoiceField(choices=PipelineStatus.choices)
    reason = forms.CharField(max_length=2000, required=False)


@page
def pipelines(request: HttpRequest, p: Principal) -> HttpResponse:
    found = registry_selectors.pipelines_for(p).prefetch_related("versions")
    return render(request, "routing/pipelines.html", {"pipelines": found})


@page
def pipeline_detail(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    """The pipeline's versions and, for its production (else newest) version, where each stage runs for
    the owner tenant (a platform pipeline: for a tenant the viewer picks)."""
    pipeline = registry_selectors.pipeline_get(p, owner, name)
    versions = list(pipeline.versions.all())
    shown = next(
        (v for v in versions if v.status == PipelineStatus.PRODUCTION), versions[0] if versions else None
    )
    tenants = [pipeline.owner] if pipeline.owner else list(core_selectors.tenants_for(p, Scope.REGISTRY_READ))
    tenant = next(
        (t for t in tenants if t.slug == request.GET.get("tenant")), tenants[0] if tenants else None
    )
    table = selectors.current() or services.publish()
    plan = pipeline_plan(tenant, shown, table.body) if shown and tenant else []
    context = {
        "pipeline": pipeline,
        "versions": versions,
        "shown": shown,
        "tenants": tenants,
        "tenant": tenant,
        "plan": plan,
        "servable": bool(plan) and not any(s.refusal for s in plan),
        "may_promote": p.may(Scope.REGISTRY_PROMOTE, pipeline.owner_id),
        "statuses": PipelineStatus.choices,
    }
    return render(request, "routing/pipeline.html", context)


@require_POST
@page
def pipeline_transition(request: HttpRequest, p: Principal, owner: str, name: str) -> HttpResponse:
    pipeline = registry_selectors.pipeline_get(p, owner, name)
    form = PipelineTransitionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Choose a version and the status to move it to.")
        return redirect("routing:pipeline", owner, name)
    data = form.cleaned_data
    version = registry_selectors.pipeline_version_get(pipeline, data["version"])
    moved = pipeline_services.pipeline_version_transition(
        actor=p, version=version, to=data["to"], reason=data["reason"]
    )
    messages.success(request, f"{moved} is now {moved.status}.")
    return redirect("routing:pipeline", owner, name)
