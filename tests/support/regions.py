"""Local process regions (simulated or real vLLM engines), a deployable tiny model, and waiting for them.

``make_region`` and ``tiny_model_dir`` are fixtures; tests/conftest.py offers them to every test."""

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from core.principal import Principal
from regions.drivers.base import WorkloadSpec
from regions.drivers.factory import driver_for
from regions.engines.tiny_model import write_tiny_model
from regions.models import Deployment, DeploymentTarget, Region
from regions.reconciler import reconcile_target
from regions.services.regions import region_create
from registry.models import ModelVersion
from registry.services.models import model_register
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.registry import advance, register

# A workload as the Kubernetes driver's tests render it: one L4 per replica, two replicas.
L4_SPEC = WorkloadSpec(
    name="cp-7-chat",
    labels={"controlplane.io/tenant": "acme", "controlplane.io/deployment": "7"},
    replicas=2,
    served_model_name="llama-3-8b-instruct",
    model_uri="s3://models-eu/llama/1.0.0/",
    runtime_image="vllm/vllm-openai:v0.33.0",
    engine_args={"max_model_len": 8192},
    gpu_type="L4",
    gpu_count=1,
)
TINY_ENGINE_ARGS = {"load_format": "dummy", "dtype": "float32", "max_model_len": 512}
ENGINE_START_TIMEOUT = 420  # a real vLLM engine (CPU build)


def process_spec(name: str, model_dir: Path) -> WorkloadSpec:
    """A workload serving ``model_dir`` from the host, as the process driver gets it."""
    return WorkloadSpec(
        name=name,
        labels={},
        replicas=1,
        served_model_name=name,
        model_uri=f"file://{model_dir}",
        runtime_image="",
        engine_args={},
        gpu_type="L4",
        gpu_count=1,
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture
def make_region(world, tmp_path):  # type: ignore[no-untyped-def]
    """make_region(code, jurisdiction, engine="simulator", gpus=4) → an active local process region."""
    created: list[Region] = []

    def make(
        code: str, jurisdiction: str, engine: str = "simulator", gpus: int = 4, **fields: object
    ) -> Region:
        region = region_create(
            actor=principal(world.operator),
            code=code,
            name=code.upper(),
            provider="local",
            jurisdiction=jurisdiction,
            driver="process",
            driver_config={"state_dir": str(tmp_path / code), "engine": engine},
            gpu_pools=[{"gpu_type": "L4", "memory_gib": 24, "gpu_count": gpus}],
            **fields,
        )
        created.append(region)
        return region

    yield make
    for region in created:  # never leave engines running after a test
        root = Path(region.driver_config["state_dir"])
        for workload in root.glob("*") if root.exists() else []:
            driver_for(region).delete(workload.name)
        shutil.rmtree(root, ignore_errors=True)


def kubernetes_region(
    actor: Principal,
    kubeconfig: dict[str, Any],
    directory: Path,
    code: str = "eu-central-1",
    exposure: dict[str, Any] | None = None,
    **fields: Any,
) -> Region:
    """A Kubernetes region whose cluster is the API at ``kubeconfig`` (tests.support.kube_api), with an L4
    pool, its engines exposed as ``exposure`` says (the driver's default: in-cluster); ``fields`` are the
    region's own (prometheus_url, status, ...)."""
    path = directory / f"kubeconfig-{code}"
    path.write_text(json.dumps(kubeconfig))
    return region_create(
        actor=actor,
        code=code,
        name=code.upper(),
        provider="aws",
        jurisdiction="EU",
        driver="kubernetes",
        driver_config={
            "namespace": "llm",
            "kubeconfig_file": str(path),
            "read_timeout": 5,
            **({"exposure": exposure} if exposure else {}),
        },
        gpu_pools=[
            {
                "gpu_type": "L4",
                "memory_gib": 24,
                "gpu_count": 8,
                "node_labels": {"nvidia.com/gpu.product": "NVIDIA-L4"},
            }
        ],
        **fields,
    )


def tiny_version(
    actor: Principal,
    model_dir: Path,
    *,
    owner=None,
    status: str = "production",
    name: str = "tiny-llama",
    task: str = "chat",
    **overrides: Any,
) -> ModelVersion:  # type: ignore[no-untyped-def]
    """A tiny random-weight Llama registered as a catalog model (owner None) or a tenant's model; ``name``
    and ``task`` register the same weights as another model (e.g. served for embeddings)."""
    model = model_register(
        actor=actor, owner=owner, name=name, task=task, visibility="private" if owner else "catalog"
    )
    version = register(
        model,
        actor,
        "1.0.0",
        artifact_uri=f"file://{model_dir}",
        served_model_name="tiny" if name == "tiny-llama" else name,
        parameter_count=3_000_000,
        dtype="float32",
        max_context_length=512,
        engine_args=TINY_ENGINE_ARGS,
        architecture={
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 64,
        },
        **{"allowed_jurisdictions": ["EU", "US"], "artifact_manifest": [], **overrides},
    )
    return advance(version, actor, status) if status != "draft" else version


def converge(deployment, passes: int = 1) -> None:  # type: ignore[no-untyped-def]
    for _ in range(passes):
        for target in deployment.targets.all():
            target.__class__.objects.filter(pk=target.pk).update(lease_until=None)
            reconcile_target(target.pk)


def target_of(deployment: Deployment) -> DeploymentTarget:
    return DeploymentTarget.objects.get(deployment=deployment)


def until_ready(deployment: Deployment, replicas: int = 1) -> DeploymentTarget:
    def ready():
        converge(deployment)
        target = target_of(deployment)
        return target if target.status == "ready" and target.ready_replicas == replicas else None

    return wait_for(ready, timeout=30, interval=0.3)


def replica_pids(region, deployment) -> list[int]:
    folder = Path(region.driver_config["state_dir"]) / f"cp-{deployment.pk}-{deployment.name}"
    return [json.loads(p.read_text())["pid"] for p in sorted(folder.glob("replica-*.json"))]


def ready_targets(deployment, count: int):  # type: ignore[no-untyped-def]
    def ready():
        converge(deployment)
        targets = list(DeploymentTarget.objects.filter(deployment=deployment, status="ready"))
        return targets if len(targets) == count else None

    return wait_for(ready, timeout=ENGINE_START_TIMEOUT, interval=3)
