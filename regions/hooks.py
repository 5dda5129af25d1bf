"""What regions asks of the apps above it, and tells them, without importing them: they register here from
their AppConfig.ready() (artifacts, billing), and the reconciler and the process driver call what is here.

- The weights provider (artifacts): is a verified copy of a version's weights in a region's own object
  store, and if not, what the region waits for (or why it never may start); and how a host reads a blob of
  that store into its model cache. A region with an object store and no provider starts nothing: weights
  nobody verified are never served.
- Allocation listeners (billing's metering): after every reconcile, the GPUs a target holds.
- In-cluster scalers (autoscaling): whether a Kubernetes workload is sized by an HPA or KEDA, and how.

Only types are imported from regions' models, so an AppConfig module may import this one at its top.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from regions.models import Deployment, DeploymentTarget
    from registry.models import ModelVersion

NO_WEIGHTS_PROVIDER = "no artifact service is installed to verify the weights in this region's object store"


@dataclass(frozen=True)
class WeightsWait:
    """Why an engine may not start in a region yet; ``permanent``: it never may, from these weights."""

    message: str
    permanent: bool = False


class BlobReader(Protocol):
    """A region's object store, read by content address (a file's SHA-256)."""

    @property
    def label(self) -> str: ...

    def stream(self, sha256: str) -> Iterator[bytes]: ...


class WeightsProvider(Protocol):
    def gate(self, target: DeploymentTarget) -> WeightsWait | None: ...  # None: verified, start

    def reader(self, store_config: dict[str, Any]) -> BlobReader: ...


_WEIGHTS: list[WeightsProvider] = []  # at most one


def provide_weights(provider: WeightsProvider) -> None:
    """Install the weights provider; installing again replaces it (one answer per region and version)."""
    _WEIGHTS[:] = [provider]


def weights_provider() -> WeightsProvider | None:
    return _WEIGHTS[0] if _WEIGHTS else None


# Called after reconciles with the GPUs each target holds (replicas scheduled × GPUs per replica), a
# batch of targets at a time.
Allocations = list[tuple["DeploymentTarget", int]]
ALLOCATION_LISTENERS: list[Callable[[Allocations], None]] = []


def on_allocation(listener: Callable[[Allocations], None]) -> Callable[[Allocations], None]:
    if listener not in ALLOCATION_LISTENERS:  # ready() may run twice (tests that reload apps)
        ALLOCATION_LISTENERS.append(listener)
    return listener


# Asked before a deployment that follows an alias moves to the version the alias names now; a reason
# ('' goes ahead) keeps it where it is (rollouts: one runs on this deployment, or rolled that version back
# here, so an alias moved by a sibling deployment's success must not switch this one all at once).
ALIAS_FOLLOW_VETOES: list[Callable[[Deployment, ModelVersion], str]] = []


def on_alias_follow(
    veto: Callable[[Deployment, ModelVersion], str],
) -> Callable[[Deployment, ModelVersion], str]:
    if veto not in ALIAS_FOLLOW_VETOES:
        ALIAS_FOLLOW_VETOES.append(veto)
    return veto


def alias_follow_veto(deployment: Deployment, version: ModelVersion) -> str:
    return next((reason for veto in ALIAS_FOLLOW_VETOES if (reason := veto(deployment, version))), "")


@dataclass(frozen=True)
class Scaled:
    """What one scale did (``regions.services.deployments``): per region code, (before, after) replicas."""

    deployment: Deployment
    replicas: dict[str, tuple[int, int]]
    kind: str  # "manual", or the autoscaler's decision kind (autoscaling.choices.DecisionKind)
    reason: str
    detail: dict[str, Any]


# Told inside the transaction of every scale (manual or not), so a decision log cannot miss or invent one.
SCALE_LISTENERS: list[Callable[[Scaled], None]] = []


def on_scaled(listener: Callable[[Scaled], None]) -> Callable[[Scaled], None]:
    if listener not in SCALE_LISTENERS:
        SCALE_LISTENERS.append(listener)
    return listener


# Asked for stable targets in Kubernetes regions (autoscaling), several at once (a reconcile pass asks for
# a whole region's in one go): the in-cluster autoscaler to render beside each workload
# (``WorkloadSpec.scaler``), by target id; a target left out is sized by the control plane. The first
# non-empty answer for a target wins; with no listener every workload is sized by the control plane.
IN_CLUSTER_SCALERS: list[Callable[[list[DeploymentTarget]], dict[int, dict[str, Any]]]] = []


def on_in_cluster_scaler(
    scaler: Callable[[list[DeploymentTarget]], dict[int, dict[str, Any]]],
) -> Callable[[list[DeploymentTarget]], dict[int, dict[str, Any]]]:
    if scaler not in IN_CLUSTER_SCALERS:
        IN_CLUSTER_SCALERS.append(scaler)
    return scaler


def in_cluster_scalers(targets: list[DeploymentTarget]) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for scaler in IN_CLUSTER_SCALERS:
        for target_id, spec in scaler(targets).items():
            if spec:
                found.setdefault(target_id, spec)
    return found


@dataclass(frozen=True)
class StatusChange:
    target: DeploymentTarget
    before: str
    after: str


# Told after status changes commit, all of a reconcile batch's together: the router republishes at once
# when a region starts or stops serving, instead of at its next round (a held request waits for that
# table), and once for a batch, not once per change.
STATUS_LISTENERS: list[Callable[[list[StatusChange]], None]] = []


def on_status_changed(
    listener: Callable[[list[StatusChange]], None],
) -> Callable[[list[StatusChange]], None]:
    if listener not in STATUS_LISTENERS:
        STATUS_LISTENERS.append(listener)
    return listener
