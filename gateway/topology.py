"""Gateways per region behind a global entry.

A **regional gateway** (``GATEWAY_REGIONS=eu-west-1``) runs close to its region's engines and serves only
them: ``regional`` narrows every route of the table it installs to the endpoints in its regions, so it never
sends a request across the wide area network (or a border); a route with none left there answers 503, and
the entry in front tries another region.

A **global entry** (``python -m gateway --entry``, ``GATEWAY_ENTRY_REGIONS=eu-west-1=https://gw-euw…,…``)
holds no engine: it authenticates the tenant's token against the same route table, and forwards the request
unchanged (the client's token included; the regional gateway meters and limits it, once) to the regional
gateway of a region the tenant's route is served in, in the route's order. The control plane put only regions
inside the tenant's residency in that route, so the entry never forwards outside it: a route served in no
region with a gateway here fails closed (503), whatever other regional gateways exist.
"""

import copy
from urllib.parse import urlsplit

from gateway import contract


def parse_regions(raw: str) -> frozenset[str]:
    """``GATEWAY_REGIONS``: region codes, comma-separated; empty: every region (one gateway for all)."""
    return frozenset(code.strip() for code in raw.split(",") if code.strip())


def parse_entry_regions(raw: str) -> dict[str, str]:
    """``GATEWAY_ENTRY_REGIONS``: ``code=url`` pairs, comma-separated, to each region's gateway."""
    found: dict[str, str] = {}
    for pair in filter(None, (p.strip() for p in raw.split(","))):
        code, _, url = pair.partition("=")
        code, url = code.strip(), url.strip().rstrip("/")
        if not code or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
            raise ValueError(f"GATEWAY_ENTRY_REGIONS: '{pair}' is not region=http(s)://host[:port]")
        found[code] = url
    return found


def regional(table: contract.RouteTable, regions: frozenset[str]) -> contract.RouteTable:
    """The table as a gateway serving only ``regions`` routes by (a copy; every region when empty)."""
    if not regions:
        return table
    narrowed = copy.deepcopy(table)
    for view in narrowed.get("tenants", {}).values():
        for route in view["models"].values():
            _narrow(route, regions)
        for pipeline in view.get("pipelines", {}).values():
            outside = sorted(regions - set(pipeline.get("regions", [])))
            # Fail closed: never run a tenant's stages where its data may not be (a reason it already
            # has, e.g. a stage outside residency, stays the reason).
            if outside and "unavailable" not in pipeline:
                pipeline["stages"] = []
                pipeline["unavailable"] = f"the tenant's data may not be processed in {', '.join(outside)}"
    return narrowed


def _narrow(route: contract.Route, regions: frozenset[str]) -> None:
    had = bool(route["endpoints"])
    route["endpoints"] = [e for e in route["endpoints"] if e["region"] in regions]
    if "splits" in route:
        route["splits"] = {code: split for code, split in route["splits"].items() if code in regions}
    activatable = route.get("activatable")
    if activatable is not None and activatable["region"] not in regions:
        del route["activatable"]
    if route["preferred"] not in regions:
        route["preferred"] = route["endpoints"][0]["region"] if route["endpoints"] else ""
    if had and not route["endpoints"]:
        route["unavailable"] = f"not served in this gateway's region(s): {', '.join(sorted(regions))}"


def serving_regions(route: contract.Route) -> list[str]:
    """The regions a route is served in, in the order its gateway would try them (the preferred first),
    or the region where it wakes from zero: every one inside the tenant's residency."""
    order = [e["region"] for e in route["endpoints"]]
    if not order and route.get("activatable"):
        order = [route["activatable"]["region"]]
    return list(dict.fromkeys(order))
