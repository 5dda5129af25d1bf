"""Autoscaling: a deployment's policy, the autoscaler's memory per region, and the decisions it made."""

from django.db import models
from django.utils import timezone

from autoscaling.choices import DecisionKind, ScalerMode
from regions.models import Deployment, DeploymentTarget, Region


class AutoscalingPolicy(models.Model):
    """How one deployment is sized to demand (``autoscaling.policy``): ``spec`` for every region,
    ``overrides`` per region code. Disabled, it is kept but nothing acts on it."""

    deployment = models.OneToOneField(Deployment, on_delete=models.CASCADE, related_name="autoscaling")
    enabled = models.BooleanField(default=True)
    mode = models.CharField(max_length=16, choices=ScalerMode.choices, default=ScalerMode.CONTROL_PLANE)
    spec = models.JSONField(default=dict)
    overrides = models.JSONField(default=dict, blank=True)
    updated_by_name = models.CharField(max_length=200)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"autoscaling of {self.deployment}"


class ScalerState(models.Model):
    """What the autoscaler remembers about one region of a deployment between passes.

    ``recommendations``: [[epoch seconds, replicas], ...], each entry a change of the raw recommendation,
    kept as long as the longest stabilization window needs (written only when it changes). ``changes``:
    [[epoch, from, to], ...] within the longest rate-limit period. ``samples``: the last hour of
    [[epoch, replicas, {signal: value}], ...] at most once a minute, for the console's timeline.
    """

    target = models.OneToOneField(DeploymentTarget, on_delete=models.CASCADE, related_name="scaler")
    recommendations = models.JSONField(default=list, blank=True)
    changes = models.JSONField(default=list, blank=True)
    samples = models.JSONField(default=list, blank=True)
    signals = models.JSONField(default=dict, blank=True)  # the last pass's values, per replica
    limited = models.TextField(blank=True)  # why it could not grow ("capacity-limited: …"), '' when it could
    evaluated_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"scaler of {self.target}"


class ScalingDecision(models.Model):
    """A change the autoscaler (or a gateway's activation) made, with its reason and the signals then."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="scaling_decisions")
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=24, choices=DecisionKind.choices)
    from_replicas = models.PositiveSmallIntegerField()
    to_replicas = models.PositiveSmallIntegerField()
    reason = models.TextField()
    signals = models.JSONField(default=dict, blank=True)
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.deployment}@{self.region.code} {self.from_replicas}→{self.to_replicas}"
