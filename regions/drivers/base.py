"""The interface every region driver implements, and the shapes it speaks in."""

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from core.errors import ValidationFailed
from registry.sources import check_readable


class DriverError(Exception):
    """A driver call failed. ``permanent`` errors (bad arguments, a missing image) are not retried."""

    def __init__(self, message: str, *, permanent: bool = False):
        super().__init__(message)
        self.message = message
        self.permanent = permanent


def check_model_source(uri: str) -> None:
    """Before a driver reads a version's own URI (no regional copy): the operator's allow-list, as ingest
    applies it (registry.sources), a refusal being permanent."""
    try:
        check_readable(uri)
    except ValidationFailed as exc:
        raise DriverError(exc.message, permanent=True) from exc


@dataclass(frozen=True)
class WorkloadSpec:
    """What one deployment should run in one region. ``replicas`` is compared on its own, so scaling never
    changes the hash and a hash mismatch always means the workload itself differs.

    ``scaler``, when set, hands the replica count to an autoscaler inside the region (Kubernetes: an HPA or
    a KEDA ScaledObject, ``regions.drivers.kubernetes_scaling`` documents its keys); ``replicas`` is then
    neither applied nor compared. It is in ``spec_hash`` (a new target re-applies) but not in
    ``template_hash``, so retuning the autoscaler never restarts an engine.
    """

    name: str
    labels: dict[str, str]
    replicas: int
    served_model_name: str
    model_uri: str
    runtime_image: str
    engine_args: dict[str, Any]
    gpu_type: str
    gpu_count: int
    # Where the weights come from inside the region: its object store and the files (path, sha256) to
    # fetch into the model cache. Empty when the region has no store and serves model_uri directly.
    model_store: dict[str, Any] = field(default_factory=dict)
    model_files: list[list[str]] = field(default_factory=list)
    node_labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)
    # The version's artifact size: clusters size the model-cache volume from it.
    artifact_bytes: int = 0
    scaler: dict[str, Any] = field(default_factory=dict)
    # The fingerprint of the engines' API key (regions/engine_keys.py; the key itself is never in a spec):
    # '' starts them without one.
    api_key_id: str = ""

    @property
    def spec_hash(self) -> str:
        # An empty scaler is left out, so the hash of every workload the control plane scales is what it
        # was before scalers existed (a changed hash would re-apply, and restart, all of them).
        return _digest(self, drop={"replicas"} if self.scaler else {"replicas", "scaler"})

    @property
    def template_hash(self) -> str:
        """What the engines run, without how many of them or who decides that."""
        return _digest(self, drop={"replicas", "scaler"})

    @property
    def delegated(self) -> bool:
        return bool(self.scaler)


def _digest(spec: WorkloadSpec, drop: set[str]) -> str:
    # A workload without an API key hashes as before keys existed.
    body = {k: v for k, v in asdict(spec).items() if k not in drop and (k != "api_key_id" or v)}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class ObservedWorkload:
    """What the driver sees in the region right now."""

    spec_hash: str
    replicas: int
    ready_replicas: int
    endpoints: list[str] = field(default_factory=list)
    needs_repair: bool = False
    problem: str = ""
    problem_is_permanent: bool = False
    # Per ready replica: seconds from scheduling to weights cached and to engine ready (if known).
    cold_starts: list[dict[str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class Survey:
    """A region's workloads from a few listings. ``settled``: those whose rollout is complete, as far as a
    comparison with the record needs (no cold starts); ``observed``: when the survey listed pods too, every
    workload it can vouch for exactly as ``observe`` would find it; ``present`` names every one that
    exists."""

    settled: dict[str, ObservedWorkload]
    present: frozenset[str]
    observed: dict[str, ObservedWorkload] = field(default_factory=dict)


class WorkloadDriver(Protocol):
    def apply(self, spec: WorkloadSpec, absent: bool = False) -> None:
        """Create or update the workload. ``absent``: the caller just saw none (a survey), so there is no
        current one to read first."""
        ...

    def observe(self, name: str) -> ObservedWorkload | None: ...

    def delete(self, name: str) -> None: ...

    def render(self, spec: WorkloadSpec) -> str: ...

    def survey(self, starting: bool = False) -> Survey | None:
        """The region's workloads from a few listings rather than a look per workload: the reconciler
        leaves alone a target whose workload is settled in it exactly as recorded, does not look for one
        that is not present, and observes every other one by itself, unless ``starting`` (engines are
        coming up) had the survey observe them all. None: this driver cannot survey."""
        ...


def check_otlp_traces_endpoint(value: object) -> None:
    """A driver's ``otlp_traces_endpoint``: '' (tracing off) or the http(s) URL of an OTLP receiver."""
    if not isinstance(value, str) or (value and not re.fullmatch(r"https?://[^\s\x00]{1,500}", value)):
        raise ValidationFailed(
            "otlp_traces_endpoint must be an http(s) URL of an OTLP receiver (or left out)."
        )


def tracing_flags(otlp_traces_endpoint: str) -> list[str]:
    """vLLM's flags to send its spans (queue, prefill, decode) under the gateway's trace, which the gateway
    passes as ``traceparent``; none when no receiver is set."""
    return ["--otlp-traces-endpoint", otlp_traces_endpoint] if otlp_traces_endpoint else []
