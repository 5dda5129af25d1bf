"""The route table in formats existing gateways consume."""

from gateway import contract


def nginx(tenants: dict[str, contract.TenantRoutes], generation: int) -> str:
    """One upstream per (tenant, model): the first tier as weighted servers, later tiers as ``backup``.

    nginx sends to backup servers only when every primary one is down, which is the table's failover order.
    """
    lines = [f"# route table generation {generation}; regenerate on change (ETag) and reload nginx", ""]
    for slug, view in sorted(tenants.items()):
        for name, route in sorted(view["models"].items()):
            lines.append(f"upstream {slug}__{name} {{")
            if not route["endpoints"]:
                lines.append(f"    # unavailable: {route.get('unavailable', '')}")
                lines.append("    server 127.0.0.1:9 down;  # fail closed: never a region outside residency")
            for endpoint in route["endpoints"]:
                host = endpoint["url"].split("://", 1)[-1]
                backup = " backup" if endpoint["priority"] > 0 else ""
                lines.append(
                    f"    server {host} weight={endpoint['weight']} max_fails=2 fail_timeout=30s{backup};"
                    f"  # {endpoint['region']} {endpoint['version']}"
                )
            lines += ["    keepalive 32;", "}", ""]
    return "\n".join(lines)
