"""The decision log: one row per region per scale, written in the scale's own transaction."""

from autoscaling.models import ScalingDecision
from regions import hooks
from regions.models import Region


def record_scaled(scaled: hooks.Scaled) -> None:
    """``regions.hooks.on_scaled`` listener: every change of replicas, by hand or not, with its reason."""
    regions = {r.code: r for r in Region.objects.filter(code__in=scaled.replicas)}
    ScalingDecision.objects.bulk_create(
        ScalingDecision(
            deployment=scaled.deployment,
            region=regions[code],
            kind=scaled.kind,
            from_replicas=before,
            to_replicas=after,
            reason=scaled.reason,
            signals=scaled.detail.get("signals", {}).get(code, {}),
        )
        for code, (before, after) in scaled.replicas.items()
        if before != after
    )
