"""Reading a Kubernetes workload's state from what the cluster reports: which pods are of the spec last
applied, how many of them answer (the Deployment's rollout progress: observedGeneration, updatedReplicas,
readyReplicas and availableReplicas), why the others do not, and each replica's cold start."""

from typing import Any

from regions.drivers.kubernetes_scaling import SCALER_ANNOTATION

PERMANENT_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError"}
# On the pod template and in the Service's selector: the Service answers only with pods of the spec that was
# last applied, never with an older ReplicaSet's pods still running during a rolling update.
SPEC_LABEL = "controlplane.io/spec"
FETCH_CONTAINER = "fetch-model"  # the init container that copies the weights into the model cache


def pod_problem(pod: Any) -> tuple[str, bool]:
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"Unschedulable: {condition.message or condition.reason}", False
    for status in (pod.status.init_container_statuses or []) + (pod.status.container_statuses or []):
        waiting = status.state.waiting if status.state else None
        if waiting and waiting.reason not in (None, "ContainerCreating", "PodInitializing"):
            return f"{waiting.reason}: {waiting.message or ''}".strip(
                ": "
            ), waiting.reason in PERMANENT_REASONS
        terminated = status.last_state.terminated if status.last_state else None
        if terminated and terminated.reason == "OOMKilled":
            return (
                "OOMKilled: the engine ran out of memory; use a larger GPU or a smaller max_model_len",
                False,
            )
    return "", False


def cold_start(index: int, pod: Any) -> dict[str, float] | None:
    """Scheduled → weights cached (the fetch-model init container finished) → engine Ready, from the pod's
    own condition and container timestamps, so it is what the kubelet saw, not when we happened to look."""
    since = {c.type: c.last_transition_time for c in pod.status.conditions or [] if c.status == "True"}
    scheduled, ready = since.get("PodScheduled"), since.get("Ready")
    if not (scheduled and ready):
        return None
    fetched = [
        status.state.terminated.finished_at
        for status in pod.status.init_container_statuses or []
        if status.name == FETCH_CONTAINER and status.state and status.state.terminated
    ]
    cached = fetched[0] if fetched and fetched[0] else scheduled
    return {
        "replica": index,
        "weights_seconds": round((cached - scheduled).total_seconds(), 2),
        "engine_seconds": round((ready - cached).total_seconds(), 2),
        "total_seconds": round((ready - scheduled).total_seconds(), 2),
    }


def current_pods(deployment: Any, pods: list[Any]) -> list[Any]:
    """The pods of the spec last applied (the template's spec label), not an older ReplicaSet's. A
    template without the label was applied before it existed: all its pods are of that template."""
    want = (deployment.spec.template.metadata.labels or {}).get(SPEC_LABEL)
    if want is None:
        return pods
    return [pod for pod in pods if (pod.metadata.labels or {}).get(SPEC_LABEL) == want]


def pod_ready(pod: Any) -> bool:
    conditions = pod.status.conditions if pod.status else None
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions or [])
    return ready and pod.metadata.deletion_timestamp is None


def ready_replicas(deployment: Any, current: list[Any]) -> int:
    """Replicas of the spec last applied that answer. From the controller's own status once it has observed
    that spec: readyReplicas counts old and new pods alike, so every old pod is assumed to be among them
    and the count never names a new replica that is not answering. Until the controller has observed the
    generation (observedGeneration below metadata.generation), its counts are of the previous spec: count
    the current spec's Ready pods instead (none after a spec change, all of them after a mere scale)."""
    status = deployment.status
    if status is None or (status.observed_generation or 0) < (deployment.metadata.generation or 0):
        return sum(1 for pod in current if pod_ready(pod))
    updated = status.updated_replicas or 0
    old = max(0, (status.replicas or 0) - updated)
    # Available is Ready for the Deployment's minReadySeconds: the stricter of the two counts.
    available = status.ready_replicas if status.available_replicas is None else status.available_replicas
    answering = min(status.ready_replicas or 0, available or 0)
    return max(0, min(updated, answering - old))


def settled_replicas(deployment: Any) -> int | None:
    """The replicas of a Deployment whose rollout is complete by its own status (the controller has observed
    the spec, every replica is updated, ready and available), else None: such a workload needs no look at
    its pods. A scaler sizing it in the cluster makes it None too (its count is not ours to compare)."""
    status, meta = deployment.status, deployment.metadata
    if status is None or (meta.annotations or {}).get(SCALER_ANNOTATION):
        return None
    replicas = deployment.spec.replicas or 0
    counts = (status.replicas, status.updated_replicas, status.ready_replicas, status.available_replicas)
    current = (status.observed_generation or 0) >= (meta.generation or 0)
    return replicas if current and all((count or 0) == replicas for count in counts) else None


def stalled(deployment: Any) -> str:
    """The controller gave up waiting for the rollout (progressDeadlineSeconds). Not permanent: it keeps
    trying, and a cause that is permanent (a missing image) is reported from the pods first."""
    for condition in (deployment.status.conditions if deployment.status else None) or []:
        if condition.type == "Progressing" and condition.reason == "ProgressDeadlineExceeded":
            return f"ProgressDeadlineExceeded: {condition.message or 'the rollout made no progress'}"
    return ""


def cold_starts(pods: list[Any]) -> list[dict[str, float]]:
    timings = (cold_start(index, pod) for index, pod in enumerate(pods))
    return [timing for timing in timings if timing]


def first_problem(pods: list[Any]) -> tuple[str, bool]:
    for pod in pods:
        problem = pod_problem(pod)
        if problem[0]:
            return problem
    return "", False
