"""A placement for the route computation's tests: one ready deployment in one EU region, with any field
changed by keyword."""

from typing import Any

from routing.routes import Endpoint, Placement


def placement(**fields: Any) -> Placement:
    defaults: dict[str, Any] = {
        "tenant": "acme",
        "name": "chat",
        "deployment_id": 7,
        "version": "m@1",
        "served_model": "m",
        "artifact_sha256": "0" * 64,
        "allowed_jurisdictions": frozenset({"EU"}),
        "region": "eu-west-1",
        "jurisdiction": "EU",
        "region_active": True,
        "ready": True,
        "weights_verified": True,
        "endpoints": (Endpoint("http://127.0.0.1:1"),),
    }
    return Placement(**{**defaults, **fields})
