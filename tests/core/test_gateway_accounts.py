"""A gateway's service account may be bound to the regions its gateways serve: platform robots only, valid
region codes only, audited, shown."""

import pytest

from core.models import AuditEvent, ServiceAccount


def test_a_platform_robot_is_bound_to_regions_and_shows_them(world, api):
    root = api(world.admin)
    made = root.post(
        "/api/v1/service-accounts/",
        {"name": "gw-eu", "role": "admin", "regions": ["eu-west-1", "eu-central-1", "eu-west-1"]},
        format="json",
    )
    assert made.status_code == 201, made.json()
    assert made.json()["regions"] == ["eu-central-1", "eu-west-1"]
    event = AuditEvent.objects.get(action="service_account.created", after__name="gw-eu")
    assert event.after["regions"] == ["eu-central-1", "eu-west-1"]


@pytest.mark.parametrize(
    "body",
    [
        {"name": "gw", "role": "developer", "tenant": "acme", "regions": ["eu-west-1"]},  # a tenant's robot
        {"name": "gw", "role": "admin", "regions": ["EU WEST"]},
        {"name": "gw", "role": "admin", "regions": ["x" * 42]},
        {"name": "gw", "role": "admin", "regions": [f"r{n}" for n in range(65)]},
        {"name": "gw", "role": "admin", "regions": "eu-west-1"},
        {"name": "gw", "role": "admin", "regions": [["eu-west-1"]]},
    ],
)
def test_bad_regions_are_refused_and_nothing_is_written(world, api, body):
    refused = api(world.admin).post("/api/v1/service-accounts/", body, format="json")
    assert refused.status_code == 400, refused.json()
    assert not ServiceAccount.objects.filter(name="gw").exists()
