"""A regional gateway's view of the route table, and the entry's configuration (gateway/topology.py)."""

import pytest

from gateway.topology import parse_entry_regions, parse_regions, regional, serving_regions


def endpoint(region: str) -> dict:  # type: ignore[type-arg]
    return {
        "url": f"http://{region}",
        "region": region,
        "priority": 0,
        "weight": 1,
        "deployment": 1,
        "version": "m@1",
        "served_model": "m",
        "artifact_sha256": "a" * 64,
        "shared": False,
    }


TABLE = {
    "tenants": {
        "acme": {
            "limits": {},
            "blocked": "",
            "models": {
                "chat": {
                    "endpoints": [endpoint("eu-west-1"), endpoint("eu-central-1")],
                    "preferred": "eu-west-1",
                    "splits": {"eu-west-1": {"candidate": 10, "mirror": 0}},
                },
                "idle": {
                    "endpoints": [],
                    "preferred": "eu-west-1",
                    "activatable": {"deployment": 2, "region": "eu-west-1"},
                },
            },
        }
    }
}


def test_a_regional_gateway_keeps_only_its_regions_endpoints():
    central = regional(TABLE, frozenset({"eu-central-1"}))  # type: ignore[arg-type]
    chat = central["tenants"]["acme"]["models"]["chat"]
    assert [e["region"] for e in chat["endpoints"]] == ["eu-central-1"]
    assert chat["preferred"] == "eu-central-1" and chat["splits"] == {}
    assert "activatable" not in central["tenants"]["acme"]["models"]["idle"]
    assert len(TABLE["tenants"]["acme"]["models"]["chat"]["endpoints"]) == 2  # the fetched table is untouched
    gone = regional(TABLE, frozenset({"us-east-1"}))["tenants"]["acme"]["models"]["chat"]  # type: ignore[arg-type]
    assert gone["endpoints"] == [] and "us-east-1" in gone["unavailable"]
    assert regional(TABLE, frozenset()) is TABLE  # type: ignore[arg-type]


def test_serving_regions_follow_the_routes_order_or_where_it_wakes():
    models = TABLE["tenants"]["acme"]["models"]
    assert serving_regions(models["chat"]) == ["eu-west-1", "eu-central-1"]  # type: ignore[arg-type]
    assert serving_regions(models["idle"]) == ["eu-west-1"]  # type: ignore[arg-type]


def test_configuration_is_parsed_strictly():
    assert parse_regions(" eu-west-1, ,eu-central-1 ") == {"eu-west-1", "eu-central-1"}
    assert parse_entry_regions("eu-west-1=https://gw.example/, us=http://10.0.0.1:8080") == {
        "eu-west-1": "https://gw.example",
        "us": "http://10.0.0.1:8080",
    }
    for bad in ("eu-west-1", "=http://x", "eu=ftp://x", "eu=http://"):
        with pytest.raises(ValueError, match="GATEWAY_ENTRY_REGIONS"):
            parse_entry_regions(bad)
