"""Regions with their GPU pools, and deployments: desired state per region, observed by the reconciler."""

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from core.choices import Jurisdiction
from core.models import REGION_CODE as CODE
from core.models import Tenant
from regions.choices import (
    DeploymentState,
    DriverKind,
    PlacementMode,
    Provider,
    RegionStatus,
    TargetPurpose,
    TargetRole,
    TargetStatus,
)
from registry.models import ModelVersion, RegisteredModel

REGION_CODE = RegexValidator(f"^{CODE}$", "Lowercase letters, digits and dashes, e.g. eu-west-1.")


class Region(models.Model):
    """A place GPUs run: a Kubernetes cluster or a pool of hosts, in one jurisdiction.

    ``driver_config`` is the driver's own typed settings (regions.drivers), e.g. the kubeconfig reference
    and namespace for Kubernetes; secrets are referenced (env var or file), never stored. A draining
    region takes no new placements; a disabled one serves nothing.
    """

    code = models.CharField(max_length=41, unique=True, validators=[REGION_CODE])
    name = models.CharField(max_length=200)
    provider = models.CharField(max_length=16, choices=Provider.choices)
    city = models.CharField(max_length=100, blank=True)
    latitude = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(-90), MaxValueValidator(90)]
    )
    longitude = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(-180), MaxValueValidator(180)]
    )
    jurisdiction = models.CharField(max_length=2, choices=Jurisdiction.choices)
    certifications = models.JSONField(default=list, blank=True)
    status = models.CharField(max_length=16, choices=RegionStatus.choices, default=RegionStatus.ACTIVE)
    driver = models.CharField(max_length=16, choices=DriverKind.choices)
    driver_config = models.JSONField(default=dict, blank=True)
    object_store = models.JSONField(default=dict, blank=True)
    prometheus_url = models.URLField(blank=True)
    reconcile_concurrency = models.PositiveSmallIntegerField(
        default=4, validators=[MinValueValidator(1), MaxValueValidator(64)]
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["code"]

    def __str__(self) -> str:
        return self.code


class GpuPool(models.Model):
    """GPUs of one type in a region, with the node labels and taints that select them."""

    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="gpu_pools")
    gpu_type = models.CharField(max_length=32)
    memory_gib = models.PositiveIntegerField()
    gpu_count = models.PositiveIntegerField()
    pricing_model = models.CharField(max_length=16, default="on_demand")  # billing.choices.PricingModel
    node_labels = models.JSONField(default=dict, blank=True)
    taints = models.JSONField(default=list, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["region", "gpu_type"], name="pool_unique_gpu_type")]
        ordering = ["region__code", "gpu_type"]

    def __str__(self) -> str:
        return f"{self.region.code}/{self.gpu_type}×{self.gpu_count}"


class Deployment(models.Model):
    """A tenant's wish: this model version (or whatever an alias points at) served in these regions.

    ``generation`` grows with every change of the wish; each region's target records the generation it
    last converged to (``observed_generation``), like Kubernetes' status.
    """

    owner = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="deployments")
    name = models.SlugField(max_length=40)
    model = models.ForeignKey(RegisteredModel, on_delete=models.PROTECT, related_name="deployments")
    version = models.ForeignKey(ModelVersion, on_delete=models.PROTECT, related_name="deployments")
    follow_alias = models.SlugField(max_length=64, blank=True)
    placement_mode = models.CharField(
        max_length=16, choices=PlacementMode.choices, default=PlacementMode.EXPLICIT
    )
    min_regions = models.PositiveSmallIntegerField(default=1)
    replicas = models.PositiveSmallIntegerField(default=1, validators=[MaxValueValidator(64)])
    min_replicas = models.PositiveSmallIntegerField(default=0)
    max_replicas = models.PositiveSmallIntegerField(default=8, validators=[MaxValueValidator(64)])
    gpu_type = models.CharField(max_length=32)
    gpu_count = models.PositiveSmallIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(64)]
    )
    engine_overrides = models.JSONField(default=dict, blank=True)
    state = models.CharField(max_length=16, choices=DeploymentState.choices, default=DeploymentState.ACTIVE)
    # A platform-run deployment of a catalog model that every tenant may call (residency still applies);
    # its GPU cost is split over the tenants by their tokens, the unused share is platform idle cost.
    shared = models.BooleanField(default=False)
    # Other model names of the same caller, tried in order when this one cannot serve (no compliant
    # endpoint, saturated, or the tenant past its budget's degrade threshold): routing/routes.py.
    fallbacks = models.JSONField(default=list, blank=True)
    generation = models.PositiveIntegerField(default=1)
    created_by_name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["owner", "name"],
                condition=~models.Q(state=DeploymentState.DELETED),
                name="deployment_unique_live_name",
            )
        ]
        ordering = ["owner__slug", "name"]

    def __str__(self) -> str:
        return f"{self.owner.slug}/{self.name}"


class DeploymentTarget(models.Model):
    """One revision of a deployment in one region: desired replicas, what the driver last reported, and
    retry state.

    pending → provisioning → ready ⇄ degraded;  any → failed (permanent driver error) → provisioning on
    the next change;  ready/… → paused (zero replicas);  any → deleting → deleted.

    A region has one stable target (revision 0 at first) and, during a rollout, a candidate beside it
    (its own revision number, so its own workload name). ``version`` is null on a stable target, which
    runs the deployment's version; a candidate or retiring target names the version it runs.
    """

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="targets")
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="targets")
    role = models.CharField(max_length=16, choices=TargetRole.choices, default=TargetRole.STABLE)
    revision = models.PositiveIntegerField(default=0)
    version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="revision_targets"
    )
    # A candidate's share of the region's requests, and the share of them copied to it (shadow), 0..100.
    traffic_percent = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)])
    mirror_percent = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(100)])
    purpose = models.CharField(max_length=16, choices=TargetPurpose.choices, default=TargetPurpose.SERVING)
    remove_after = models.DateTimeField(null=True, blank=True)  # retiring: the drain ends, the workload goes
    # Leaving a draining or disabled region: where its replicas were re-placed (regions/services/fleet.py).
    replaced_in = models.CharField(max_length=41, blank=True)
    desired_replicas = models.PositiveSmallIntegerField(default=1)
    # At zero because the autoscaler found it idle (not paused by hand): the route table offers it as
    # activatable, and a request held at a gateway wakes it. Any other scale clears it.
    wakes_on_request = models.BooleanField(default=False)
    # Added by the autoscaler when this region's deployment had no room left in the region named here: it
    # takes that region's overflow, so the route table puts it in that region's tier.
    overflow_of = models.CharField(max_length=41, blank=True)
    status = models.CharField(max_length=16, choices=TargetStatus.choices, default=TargetStatus.PENDING)
    ready_replicas = models.PositiveSmallIntegerField(default=0)
    endpoints = models.JSONField(default=list, blank=True)
    last_error = models.TextField(blank=True)
    last_transition_at = models.DateTimeField(default=timezone.now)
    observed_generation = models.PositiveIntegerField(default=0)
    applied_hash = models.CharField(max_length=64, blank=True)
    cold_starts = models.JSONField(default=list, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now, db_index=True)
    lease_until = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "region", "role"],
                condition=models.Q(role__in=[TargetRole.STABLE, TargetRole.CANDIDATE]),
                name="target_unique_role_per_region",
            )
        ]
        ordering = ["region__code", "revision"]

    def __str__(self) -> str:
        return f"{self.deployment}@{self.region.code}"


class DeploymentEvent(models.Model):
    """The timeline of a deployment: status changes, drift corrections, errors, scaling."""

    deployment = models.ForeignKey(Deployment, on_delete=models.CASCADE, related_name="events")
    region = models.ForeignKey(Region, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=32)
    message = models.TextField()
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.deployment} {self.kind}: {self.message[:60]}"
