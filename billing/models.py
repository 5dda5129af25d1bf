"""Metering and prices: usage per request, GPU capacity held over time, prices with history, budget alerts."""

from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from billing.choices import PricingModel, UsageTrack
from regions.choices import TargetPurpose


class UsageRecord(models.Model):
    """A request as the gateway saw it. ``request_id`` is unique, so a batch sent twice counts once.

    ``request_id`` is minted by the gateway for every request; the client's own ``X-Request-ID`` is kept
    apart as ``client_request_id``, meaningful only within its tenant (two tenants may send the same one).

    Region, deployment, version and artifact checksum are copied from the route the gateway used, so a
    request id traces to exactly what served it even after the deployment moves on. ``track`` says which
    revision served it during a rollout; a ``mirror`` record is a shadow copy the client never saw: it is
    evidence for the rollout's analysis and the platform's evaluation cost, never billed to the tenant.
    """

    request_id = models.CharField(max_length=64, unique=True)
    client_request_id = models.CharField(max_length=128, blank=True, default="")
    tenant = models.ForeignKey("controlplane.Tenant", on_delete=models.PROTECT, related_name="usage")
    model_name = models.CharField(max_length=100)
    # A request served by a fallback: the model name that served it (model_name is what the client asked
    # for; version is what answered) and why the gateway degraded (capacity, budget, unavailable).
    served_model_name = models.CharField(max_length=100, blank=True, default="")
    degraded = models.CharField(max_length=16, blank=True, default="")
    trace_id = models.CharField(max_length=32, blank=True, default="")  # the gateway's OpenTelemetry trace
    # A pipeline's model stage: the pipeline's version ("acme/support-rag@1.0.0") and the stage's name.
    pipeline = models.CharField(max_length=200, blank=True, default="")
    stage = models.CharField(max_length=63, blank=True, default="")
    region = models.CharField(max_length=41)
    deployment = models.ForeignKey(
        "regions.Deployment", null=True, blank=True, on_delete=models.SET_NULL, related_name="usage"
    )
    version = models.CharField(max_length=200)
    artifact_sha256 = models.CharField(max_length=64, blank=True)
    endpoint = models.CharField(max_length=500, blank=True)
    status = models.PositiveSmallIntegerField()
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    latency_ms = models.FloatField()
    attempts = models.PositiveSmallIntegerField(default=1)
    stream = models.BooleanField(default=False)
    track = models.CharField(max_length=16, choices=UsageTrack.choices, default=UsageTrack.STABLE)
    ttft_ms = models.FloatField(null=True, blank=True)  # to the answer's first byte; None: none came
    # A rollout's candidate failing before the first byte, retried elsewhere: the analysis counts these.
    candidate_errors = models.PositiveSmallIntegerField(default=0)
    started_at = models.DateTimeField()
    hour = models.DateTimeField()  # started_at truncated to the UTC hour: the reports' bucket, stored
    received_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-started_at"]
        indexes = [
            models.Index(fields=["tenant", "started_at"]),
            models.Index(fields=["started_at"]),
            models.Index(fields=["tenant", "client_request_id"], name="usage_tenant_client_id"),
            # A rollout's analysis: one version's requests in one region of one deployment, in a window.
            models.Index(
                fields=["deployment", "region", "version", "started_at"], name="usage_rollout_window"
            ),
        ]

    def __str__(self) -> str:
        return self.request_id


class GpuPrice(models.Model):
    """The hourly price of one GPU of a type in a region under a pricing model, from ``effective_from``.

    Prices are never edited: a change is a new row, so every past hour is priced with the price in force
    then. Money is ``Decimal`` end to end.
    """

    region = models.ForeignKey("regions.Region", on_delete=models.CASCADE, related_name="gpu_prices")
    gpu_type = models.CharField(max_length=32)
    pricing_model = models.CharField(
        max_length=16, choices=PricingModel.choices, default=PricingModel.ON_DEMAND
    )
    hourly_price = models.DecimalField(max_digits=12, decimal_places=4, validators=[MinValueValidator(0)])
    currency = models.CharField(max_length=3, default="USD")
    effective_from = models.DateTimeField()
    created_by_name = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["region", "gpu_type", "pricing_model", "effective_from"], name="price_unique_start"
            )
        ]
        ordering = ["region__code", "gpu_type", "pricing_model", "effective_from"]

    def __str__(self) -> str:
        return f"{self.region.code} {self.gpu_type} {self.pricing_model} {self.hourly_price} {self.currency}"


class CapacitySegment(models.Model):
    """GPUs one revision of a deployment held in a region from ``started_at`` to ``ended_at`` (open while
    it still does).

    The reconciler closes the open segment and opens a new one whenever the count, the version or the
    purpose changes (scale, crash, restart, delete, a shadow candidate put to serving), so GPU-seconds are
    exact to the reconcile that saw the change. During a rollout a region has one open segment per live
    revision (stable, candidate, a draining retiring one). ``purpose`` says who pays: serving capacity
    is the deployment owner's (or, shared, its users'), evaluation capacity (a shadow candidate's) is the
    platform's.
    """

    deployment = models.ForeignKey("regions.Deployment", on_delete=models.CASCADE, related_name="capacity")
    version = models.ForeignKey("registry.ModelVersion", on_delete=models.PROTECT, related_name="capacity")
    region = models.ForeignKey("regions.Region", on_delete=models.PROTECT, related_name="capacity")
    revision = models.PositiveIntegerField(default=0)  # the target's: one workload of the deployment
    purpose = models.CharField(max_length=16, choices=TargetPurpose.choices, default=TargetPurpose.SERVING)
    gpu_type = models.CharField(max_length=32)
    gpus = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["started_at"]
        indexes = [models.Index(fields=["region", "started_at"]), models.Index(fields=["ended_at"])]
        constraints = [
            models.UniqueConstraint(
                fields=["deployment", "region", "revision"],
                condition=models.Q(ended_at__isnull=True),
                name="one_open_segment_per_revision",
            )
        ]

    def __str__(self) -> str:
        return f"{self.deployment_id}r{self.revision}@{self.region_id}: {self.gpus} × {self.gpu_type}"


class BudgetAlert(models.Model):
    """A budget threshold crossed in a month; unique, so each fires once per period.

    It has one state, fired: ``services.budget_alert_fire`` inserts it (the unique constraint is the
    compare-and-set between concurrent evaluators) together with its audit event, and the webhook goes
    out once that transaction commits. A hard limit's 100 % alert blocks the tenant until the month ends.
    """

    tenant = models.ForeignKey("controlplane.Tenant", on_delete=models.CASCADE, related_name="budget_alerts")
    period = models.CharField(max_length=7)  # YYYY-MM
    threshold = models.PositiveSmallIntegerField()  # percent
    spent = models.DecimalField(max_digits=14, decimal_places=2)
    budget = models.DecimalField(max_digits=14, decimal_places=2)
    fired_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period", "threshold"], name="alert_once_per_period")
        ]
        ordering = ["-fired_at"]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.period} {self.threshold}%"
