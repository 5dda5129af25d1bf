"""One placement preview: the console's new-deployment form shows what the API's placement endpoint
answers, and offers exactly the versions the caller may deploy."""

import pytest

from core.errors import Conflict
from regions.services.deployments import deployment_create
from registry.selectors import deployable_versions
from tests.support.principals import principal
from tests.support.regions import tiny_version


@pytest.fixture
def version(world, make_region, tiny_model_dir):
    make_region("eu-west-1", "EU")
    make_region("ch-zrh-1", "CH")
    make_region("us-east-1", "US")
    return tiny_version(principal(world.operator), tiny_model_dir)


@pytest.mark.parametrize("replicas", ["1", "5"])
def test_the_console_shows_the_apis_preview(world, version, api, client, replicas):
    query = f"owner=acme&model=platform/tiny-llama&version=1.0.0&replicas={replicas}"
    answer = api(world.alice).get(f"/api/v1/deployments/placement/?{query}").json()
    client.force_login(world.alice)
    page = client.get(f"/deployments/new/?owner=acme&version={version.pk}&replicas={replicas}")
    assert page.status_code == 200
    shown = {c.region.code: (c.eligible, c.reasons, c.free_gpus) for c in page.context["choices"]}
    assert shown == {r["code"]: (r["eligible"], r["reasons"], r["free_gpus"]) for r in answer["regions"]}
    assert shown["eu-west-1"][0] is (replicas == "1")


def test_the_form_offers_the_versions_the_service_admits(world, make_region, tiny_model_dir):
    make_region("eu-west-1", "EU")
    staged = tiny_version(principal(world.operator), tiny_model_dir, status="staged")
    alice = principal(world.alice)
    assert list(deployable_versions(alice)) == []
    assert list(deployable_versions(principal(world.operator))) == [staged]
    with pytest.raises(Conflict, match="deployable versions are canary, production"):
        deployment_create(actor=alice, owner=world.tenant_a, name="chat", model=staged.model, version="1.0.0")
