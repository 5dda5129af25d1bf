"""A deployment of the tiny model in local simulator regions, with a second version to roll out."""

from dataclasses import dataclass
from typing import Any

from core.principal import Principal
from regions.choices import TargetRole
from regions.models import Deployment, DeploymentTarget
from regions.services.deployments import deployment_create
from registry.models import ModelVersion
from rollouts import controller
from rollouts.models import Rollout
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.regions import TINY_ENGINE_ARGS, converge, tiny_version
from tests.support.registry import advance, register


@dataclass
class Stage:
    deployment: Deployment
    baseline: ModelVersion
    candidate: ModelVersion
    alice: Principal


def next_version(
    actor: Principal, baseline: ModelVersion, version: str = "2.0.0", status: str = "staged", **overrides: Any
) -> ModelVersion:
    """Another release of the baseline's model, with the same tiny weights unless told otherwise."""
    fields = {
        "artifact_uri": baseline.artifact_uri,
        "served_model_name": baseline.served_model_name,
        "parameter_count": baseline.parameter_count,
        "dtype": baseline.dtype,
        "max_context_length": baseline.max_context_length,
        "engine_args": TINY_ENGINE_ARGS,
        "architecture": baseline.architecture,
        "allowed_jurisdictions": baseline.allowed_jurisdictions,
        "artifact_manifest": [],
        **overrides,
    }
    registered = register(baseline.model, actor, version, **fields)
    return registered if status == "draft" else advance(registered, actor, status)


def stage(world, make_region, tiny_model_dir, regions=("eu-west-1",), engine="simulator") -> Stage:  # type: ignore[no-untyped-def]
    """acme's `chat` (tiny-llama 1.0.0, its own model) ready in ``regions``, and 2.0.0 staged."""
    for code in regions:
        make_region(code, "EU", engine=engine)
    alice = principal(world.alice)
    baseline = tiny_version(alice, tiny_model_dir, owner=world.tenant_a)
    candidate = next_version(alice, baseline)
    deployment = deployment_create(
        actor=alice,
        owner=world.tenant_a,
        name="chat",
        model=baseline.model,
        version="1.0.0",
        regions=list(regions),
    )
    wait_for(lambda: converge(deployment) or _all_ready(deployment), timeout=60, interval=0.3)
    return Stage(deployment, baseline, candidate, alice)


def _all_ready(deployment: Deployment) -> bool:
    live = DeploymentTarget.objects.filter(deployment=deployment).exclude(status="deleted")
    return all(t.status == "ready" for t in live)


def drive(rollout: Rollout, until: set[str], now=None, timeout: float = 60) -> Rollout:  # type: ignore[no-untyped-def]
    """Reconcile and advance until the rollout reaches one of ``until`` (states, or 'paused')."""

    def step() -> Rollout | None:
        converge(rollout.deployment)
        controller.advance(rollout.pk, now=now)
        rollout.refresh_from_db()
        return rollout if rollout.state in until else None

    return wait_for(step, timeout=timeout, interval=0.2)


def candidate_of(deployment: Deployment) -> DeploymentTarget | None:
    return DeploymentTarget.objects.filter(deployment=deployment, role=TargetRole.CANDIDATE).first()
