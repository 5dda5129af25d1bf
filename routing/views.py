"""The routing page: the route table (with each route's response cache, which a tenant's members may
switch), endpoint health, the failover timeline and the what-if view."""

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
from routing import selectors, services


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
