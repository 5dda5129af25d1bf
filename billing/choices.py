from django.db import models

from gateway import contract


class PricingModel(models.TextChoices):
    ON_DEMAND = "on_demand", "On-demand"
    SPOT = "spot", "Spot"
    RESERVED = "reserved", "Reserved / committed"


class UsageTrack(models.TextChoices):
    """What served a request, as the gateway reports it (``gateway.contract``): the stable revision, a
    rollout's candidate, a copy mirrored to a shadow candidate, which the client never saw and no
    tenant pays for, or the gateway's response cache: the tenant's request, but no engine ran for it."""

    STABLE = contract.STABLE, "Stable"
    CANDIDATE = contract.CANDIDATE, "Candidate"
    MIRROR = contract.MIRROR, "Mirror (shadow copy)"
    CACHE = contract.CACHED, "Response cache (no GPU)"
