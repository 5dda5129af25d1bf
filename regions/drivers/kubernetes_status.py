"""Reading a Kubernetes workload's state from what the cluster reports: which pods are of the spec last
applied, how many of them answer (the Deployment's rollout progress: observedGeneration, updatedReplicas,
readyReplicas and availableReplicas), why the others do not, and each replica's cold start.

Objects are the API server's JSON as read (``dig`` walks it): the client's generated models cost a
millisecond or more a Deployment to build, which at thousands of workloads was most of a reconcile pass.
"""

from datetime import datetime
from typing import Any

from regions.drivers.kubernetes_scaling import SCALER_ANNOTATION

PERMANENT_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
# On the pod template and in the Service's selector: the Service answers only with pods of the spec that was
# last applied, never with an older ReplicaSet's pods still running during a rolling update.
SPEC_LABEL = "controlplane.io/spec"
FETCH_CONTAINER = "fetch-model"  # the init container that copies the weights into the model cache


def dig(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, None where a step is missing (the API server leaves out empty fields)."""
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def annotations(obj: dict[str, Any]) -> dict[str, str]:
    return dig(obj, "metadata", "annotations") or {}


def pod_problem(pod: dict[str, Any]) -> tuple[str, bool]:
    for condition in dig(pod, "status", "conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"Unschedulable: {condition.get('message') or condition.get('reason')}", False
    statuses = (dig(pod, "status", "initContainerStatuses") or []) + (
        dig(pod, "status", "containerStatuses") or []
    )
    for status in statuses:
        waiting = dig(status, "state", "waiting")
        reason = dig(waiting, "reason")
        if waiting is not None and reason not in (None, "ContainerCreating", "PodInitializing"):
            return f"{reason}: {waiting.get('message') or ''}".strip(": "), reason in PERMANENT_REASONS
        if dig(status, "lastState", "terminated", "reason") == "OOMKilled":
            return (
                "OOMKilled: the engine ran out of memory; use a larger GPU or a smaller max_model_len",
                False,
            )
    return "", False


def cold_start(index: int, pod: dict[str, Any]) -> dict[str, float] | None:
    """Scheduled → weights cached (the fetch-model init container finished) → engine Ready, from the pod's
    own condition and container timestamps, so it is what the kubelet saw, not when we happened to look."""
    since = {
        c.get("type"): _time(c.get("lastTransitionTime"))
        for c in dig(pod, "status", "conditions") or []
        if c.get("status") == "True"
    }
    scheduled, ready = since.get("PodScheduled"), since.get("Ready")
    if not (scheduled and ready):
        return None
    fetched = [
        _time(dig(status, "state", "terminated", "finishedAt"))
        for status in dig(pod, "status", "initContainerStatuses") or []
        if status.get("name") == FETCH_CONTAINER and dig(status, "state", "terminated")
    ]
    cached = fetched[0] if fetched and fetched[0] else scheduled
    return {
        "replica": index,
        "weights_seconds": round((cached - scheduled).total_seconds(), 2),
        "engine_seconds": round((ready - cached).total_seconds(), 2),
        "total_seconds": round((ready - scheduled).total_seconds(), 2),
    }


def current_pods(deployment: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods of the spec last applied (the template's spec label), not an older ReplicaSet's. A
    template without the label was applied before it existed: all its pods are of that template."""
    want = (dig(deployment, "spec", "template", "metadata", "labels") or {}).get(SPEC_LABEL)
    if want is None:
        return pods
    return [pod for pod in pods if (dig(pod, "metadata", "labels") or {}).get(SPEC_LABEL) == want]


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = dig(pod, "status", "conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and dig(pod, "metadata", "deletionTimestamp") is None


def _generation_seen(deployment: dict[str, Any]) -> bool:
    """Whether the controller has observed the Deployment's current spec (else its counts are stale)."""
    seen = dig(deployment, "status", "observedGeneration") or 0
    return dig(deployment, "status") is not None and seen >= (dig(deployment, "metadata", "generation") or 0)


def ready_replicas(deployment: dict[str, Any], current: list[dict[str, Any]]) -> int:
    """Replicas of the spec last applied that answer. From the controller's own status once it has observed
    that spec: readyReplicas counts old and new pods alike, so every old pod is assumed to be among them
    and the count never names a new replica that is not answering. Until the controller has observed the
    generation (observedGeneration below metadata.generation), its counts are of the previous spec: count
    the current spec's Ready pods instead (none after a spec change, all of them after a mere scale)."""
    if not _generation_seen(deployment):
        return sum(1 for pod in current if pod_ready(pod))
    status = deployment["status"]
    updated = status.get("updatedReplicas") or 0
    old = max(0, (status.get("replicas") or 0) - updated)
    # Available is Ready for the Deployment's minReadySeconds: the stricter of the two counts.
    ready = status.get("readyReplicas") or 0
    available = status.get("availableReplicas")
    answering = min(ready, ready if available is None else available)
    return max(0, min(updated, answering - old))


def settled_replicas(deployment: dict[str, Any]) -> int | None:
    """The replicas of a Deployment whose rollout is complete by its own status (the controller has observed
    the spec, every replica is updated, ready and available), else None: such a workload needs no look at
    its pods. A scaler sizing it in the cluster makes it None too (its count is not ours to compare)."""
    if not _generation_seen(deployment) or annotations(deployment).get(SCALER_ANNOTATION):
        return None
    status = deployment["status"]
    replicas = dig(deployment, "spec", "replicas") or 0
    counts = ("replicas", "updatedReplicas", "readyReplicas", "availableReplicas")
    return replicas if all((status.get(count) or 0) == replicas for count in counts) else None


def stalled(deployment: dict[str, Any]) -> str:
    """The controller gave up waiting for the rollout (progressDeadlineSeconds). Not permanent: it keeps
    trying, and a cause that is permanent (a missing image) is reported from the pods first."""
    for condition in dig(deployment, "status", "conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("reason") == "ProgressDeadlineExceeded":
            return f"ProgressDeadlineExceeded: {condition.get('message') or 'the rollout made no progress'}"
    return ""


def cold_starts(pods: list[dict[str, Any]]) -> list[dict[str, float]]:
    timings = (cold_start(index, pod) for index, pod in enumerate(pods))
    return [timing for timing in timings if timing]


def first_problem(pods: list[dict[str, Any]]) -> tuple[str, bool]:
    for pod in pods:
        problem = pod_problem(pod)
        if problem[0]:
            return problem
    return "", False
