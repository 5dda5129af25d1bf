"""A policy handed to a Kubernetes cluster: the scaler description each region's effective policy becomes,
what the driver renders from it, and what ``check_mode`` refuses when such a policy is saved."""

from typing import Any

import pytest

from autoscaling.kubernetes import check_mode, delegated, scaler_spec
from autoscaling.policy import Policy
from core.errors import ValidationFailed
from regions.drivers.base import WorkloadSpec
from regions.drivers.kubernetes_scaling import scaler_manifest
from regions.models import Region
from tests.support.kube_schemas import scaled_object_errors, validate_kubernetes

PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
POLICY = Policy(min_replicas=0, max_replicas=8, waiting=4, running=16, kv_cache=0.9, ttft_p95_seconds=1.5)
SPEC = {"min_replicas": 1, "max_replicas": 4, "waiting": 5}


def cluster(code: str = "eu-central-1", prometheus_url: str = PROMETHEUS) -> Region:
    return Region(code=code, driver="kubernetes", prometheus_url=prometheus_url)


def hosts(code: str = "eu-west-1") -> Region:
    return Region(code=code, driver="process")


def workload(described: dict[str, Any]) -> WorkloadSpec:
    return WorkloadSpec(
        name="cp-9-chat",
        labels={},
        replicas=1,
        served_model_name="chat",
        model_uri="s3://models/chat/",
        runtime_image="vllm/vllm-openai:v0.33.0",
        engine_args={},
        gpu_type="L4",
        gpu_count=1,
        scaler=described,
    )


def test_a_policy_becomes_the_scaler_description_the_driver_renders():
    described = scaler_spec(POLICY, "keda", PROMETHEUS)
    assert described == {
        "kind": "keda",
        "min_replicas": 0,
        "max_replicas": 8,
        "metrics": [
            {"name": "vllm:num_requests_waiting", "target": 4},
            {"name": "vllm:num_requests_running", "target": 16},
            {"name": "vllm:kv_cache_usage_perc", "target": 0.9},
            {"name": "vllm:time_to_first_token_seconds", "target": 1.5, "quantile": 0.95},
        ],
        "window_seconds": 60,
        "scale_up": {"stabilization_seconds": 0, "percent": 100, "replicas": 4, "period_seconds": 60},
        "scale_down": {"stabilization_seconds": 300, "replicas": 1, "period_seconds": 60},
        "idle_seconds": 900,
        "prometheus_url": PROMETHEUS,
    }
    scaled_object = scaler_manifest(workload(described), "llm", {})
    assert scaled_object is not None and scaled_object_errors(scaled_object) == []
    assert [t["metadata"]["threshold"] for t in scaled_object["spec"]["triggers"]] == [
        "4",
        "16",
        "0.9",
        "1.5",
    ]


def test_an_hpa_description_carries_no_prometheus_and_renders_a_valid_hpa():
    policy = Policy(min_replicas=2, max_replicas=6, running=12, scale_down_stabilization_seconds=600)
    described = scaler_spec(policy, "hpa", PROMETHEUS)
    assert "prometheus_url" not in described  # an HPA reads the metrics API: a new address changes nothing
    hpa = scaler_manifest(workload(described), "llm", {})
    assert hpa is not None
    validate_kubernetes(hpa)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]] == ["vllm_num_requests_running"]


def test_only_kubernetes_regions_delegate():
    assert delegated("hpa", cluster()) and delegated("keda", cluster())
    assert not delegated("control_plane", cluster()) and not delegated("keda", hosts())


def test_control_plane_mode_needs_nothing_of_the_regions():
    check_mode(mode="control_plane", spec=SPEC, overrides={}, regions=[hosts()])


def test_a_delegating_policy_that_fits_passes():
    check_mode(mode="keda", spec={**SPEC, "min_replicas": 1}, overrides={}, regions=[cluster(), hosts()])
    check_mode(mode="hpa", spec=SPEC, overrides={}, regions=[cluster(prometheus_url="")])


def refusal(**kwargs: Any) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as raised:
        check_mode(**{"overrides": {}, "regions": [cluster()], **kwargs})
    return raised.value


def test_delegating_without_a_kubernetes_region_is_refused():
    error = refusal(mode="hpa", spec=SPEC, regions=[hosts("eu-west-1"), hosts("us-east-1")])
    assert error.detail == {"field": "mode"}
    assert "no Kubernetes region (eu-west-1, us-east-1)" in error.message


def test_keda_needs_the_regions_prometheus():
    error = refusal(mode="keda", spec=SPEC, regions=[cluster("eu-central-1"), cluster("eu-north-1", "")])
    assert error.detail == {"field": "mode", "region": "eu-north-1"}
    assert "region eu-north-1 has no prometheus_url" in error.message


def test_an_hpa_cannot_target_a_latency_quantile():
    error = refusal(mode="hpa", spec={**SPEC, "ttft_p95_seconds": 2})
    assert error.detail == {"field": "ttft_p95_seconds", "region": "eu-central-1"}
    assert error.message.startswith("ttft_p95_seconds cannot be handed to an HPA") and "keda" in error.message


def test_an_override_that_breaks_delegation_is_named_as_the_override():
    error = refusal(mode="hpa", spec=SPEC, overrides={"eu-central-1": {"min_replicas": 0}})
    assert error.detail == {"field": "min_replicas", "region": "eu-central-1"}
    assert error.message.startswith("overrides.eu-central-1.min_replicas 0 cannot be handed to an HPA")


def test_an_hpa_cannot_scale_to_zero():
    assert refusal(mode="hpa", spec={**SPEC, "min_replicas": 0}).detail["field"] == "min_replicas"


def test_keda_may_not_scale_to_zero_because_nothing_would_wake_it():
    error = refusal(mode="keda", spec={**SPEC, "min_replicas": 0})
    assert error.detail == {"field": "min_replicas", "region": "eu-central-1"}
    assert "would never wake" in error.message
