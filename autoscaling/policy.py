"""An autoscaling policy: what it targets and how fast it may move, validated field by field.

The shape is HPA v2's (``autoscaling/v2``: metrics with targets, ``behavior`` with stabilization windows
and rate-limit policies), on vLLM's demand signals instead of CPU, plus scale-to-zero after an idle
window (as Knative and KEDA do). A deployment has one policy; ``overrides`` replaces fields per region.
"""

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from core.errors import ValidationFailed

# The signals a policy may target, per replica, and what each means; the key is the policy's field.
METRICS = {
    "waiting": "vllm:num_requests_waiting",  # requests queued for a batch slot, per replica
    "running": "vllm:num_requests_running",  # requests in the running batch, per replica
    "kv_cache": "vllm:kv_cache_usage_perc",  # KV-cache blocks in use, 0..1, averaged over replicas
    "ttft_p95_seconds": "vllm:time_to_first_token_seconds",  # p95 over the window, seconds (an SLO)
}
MAX_REPLICAS = 64
MIN_TARGET = 0.001
DAY = 86_400


@dataclass(frozen=True)
class Policy:
    """One region's effective policy. Every target is optional; at least one must be set."""

    min_replicas: int = 1
    max_replicas: int = 4
    waiting: float | None = None
    running: float | None = None
    kv_cache: float | None = None
    ttft_p95_seconds: float | None = None
    tolerance: float = 0.1  # |value / target − 1| within this: no change (HPA's default)
    window_seconds: int = 60  # signals are averaged over this window
    scale_up_stabilization_seconds: int = 0
    scale_down_stabilization_seconds: int = 300
    scale_up_percent: int = 100  # per scale_up_period: at most +100 % or +4 replicas, whichever is more
    scale_up_replicas: int = 4
    scale_up_period_seconds: int = 60
    scale_down_replicas: int = 1  # per scale_down_period: at most −1 replica
    scale_down_period_seconds: int = 60
    idle_seconds: int = 900  # with min_replicas 0: no request for this long scales to zero

    def targets(self) -> dict[str, float]:
        return {name: value for name in METRICS if (value := getattr(self, name)) is not None}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


FIELDS = {f.name: f for f in fields(Policy)}
_FLOATS = {"waiting", "running", "kv_cache", "ttft_p95_seconds", "tolerance"}


def _number(name: str, raw: Any, where: str = "") -> float | int | None:
    if raw is None and name in METRICS:
        return None
    field = f"{where}{name}"
    # JSON integers have no size limit: one too large for a float is not a number a policy can hold (and
    # math.isfinite would raise OverflowError on it).
    if (
        isinstance(raw, bool)
        or not isinstance(raw, int | float)
        or (isinstance(raw, float) and not math.isfinite(raw))
        or (isinstance(raw, int) and abs(raw) > 2**53)
    ):
        raise ValidationFailed(f"{field} must be a number.", detail={"field": field})
    if name not in _FLOATS:
        if raw != int(raw):
            raise ValidationFailed(f"{field} must be a whole number.", detail={"field": field})
        return int(raw)
    return float(raw)


def _check_ranges(policy: Policy, where: str) -> None:
    def bad(name: str, message: str) -> ValidationFailed:
        return ValidationFailed(f"{where}{name} {message}", detail={"field": f"{where}{name}"})

    for name, value in policy.targets().items():
        if value < MIN_TARGET:  # also a bound: a target of 1e-320 makes value / target infinite
            raise bad(name, f"must be at least {MIN_TARGET}.")
    if policy.kv_cache is not None and policy.kv_cache > 1:
        raise bad("kv_cache", "is a fraction of the KV cache: at most 1.")
    if not policy.targets():
        raise bad("metrics", f"needs at least one target: {', '.join(METRICS)}.")
    if not 0 <= policy.min_replicas <= MAX_REPLICAS:
        raise bad("min_replicas", f"must be between 0 and {MAX_REPLICAS}.")
    if not max(1, policy.min_replicas) <= policy.max_replicas <= MAX_REPLICAS:
        raise bad("max_replicas", f"must be at least min_replicas (and 1) and at most {MAX_REPLICAS}.")
    if not 0 <= policy.tolerance < 1:
        raise bad("tolerance", "must be at least 0 and below 1.")
    windows = ("scale_up_stabilization_seconds", "scale_down_stabilization_seconds")
    for name in windows:
        if not 0 <= getattr(policy, name) <= 3600:
            raise bad(name, "must be between 0 and 3600 seconds.")
    for name in ("window_seconds", "scale_up_period_seconds", "scale_down_period_seconds"):
        if not 15 <= getattr(policy, name) <= 1800:
            raise bad(name, "must be between 15 and 1800 seconds.")
    for name in ("scale_up_percent", "scale_up_replicas", "scale_down_replicas"):
        if not 1 <= getattr(policy, name) <= 1000:
            raise bad(name, "must be between 1 and 1000.")
    if not 60 <= policy.idle_seconds <= 7 * DAY:
        raise bad("idle_seconds", "must be between 60 seconds and 7 days.")


def parse(raw: Any, *, base: Policy | None = None, where: str = "") -> Policy:
    """A policy from a JSON object (fields not given keep ``base``'s, else the defaults); 400 naming the
    first bad field otherwise. ``where`` prefixes messages (e.g. "overrides.eu-west-1.")."""
    if not isinstance(raw, dict):
        field = where.rstrip(".") or "policy"
        raise ValidationFailed(f"{field} must be an object.", detail={"field": field})
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ValidationFailed(
            f"{where}{unknown[0]} is not a policy field; fields are {', '.join(FIELDS)}.",
            detail={"field": f"{where}{unknown[0]}"},
        )
    values: dict[str, Any] = {name: _number(name, value, where) for name, value in raw.items()}
    policy = replace(base or Policy(), **values)
    _check_ranges(policy, where)
    return policy


def parse_overrides(raw: Any, base: Policy, regions: set[str]) -> dict[str, dict[str, Any]]:
    """{region code: {field: value}}: each region's fields replace the deployment's, validated merged."""
    if not isinstance(raw, dict):
        raise ValidationFailed(
            "overrides must be an object keyed by region code.", detail={"field": "overrides"}
        )
    for code, fields_ in raw.items():
        if code not in regions:
            raise ValidationFailed(
                f"overrides names {code!r}, where this deployment does not run.",
                detail={"field": "overrides"},
            )
        parse(fields_, base=base, where=f"overrides.{code}.")
    return {code: dict(value) for code, value in raw.items()}


def effective(
    spec: dict[str, Any],
    overrides: dict[str, dict[str, Any]],
    region: str,
    *,
    spec_parsed: Policy | None = None,
) -> Policy:
    """The policy one region runs under (stored specs were validated when saved); ``spec_parsed``: the
    spec already parsed, when the caller asks for many regions of one deployment."""
    base = spec_parsed or parse(spec)
    return parse(overrides[region], base=base) if region in overrides else base
