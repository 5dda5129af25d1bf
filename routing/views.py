"""The routing page: the route table, endpoint health, the failover timeline and the what-if view."""

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from core.principal import Principal
from core.views import page
from regions import selectors as region_selectors
from routing import selectors, services


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
    failed = request.GET.get("what_if", "")
    context = {
        "table": table,
        "rows": rows,
        "health": selectors.endpoint_health(p),
        "events": selectors.routing_events(p)[:50],
        "regions": regions,
        "what_if": failed if failed in regions else "",
        "impact": selectors.what_if(p, failed) if failed in regions else None,
    }
    return render(request, "routing/routing.html", context)
