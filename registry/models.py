"""The model registry: models, their versions as releases, validation reports and aliases."""

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.utils import timezone

from core.models import Tenant
from registry.choices import (
    ArtifactFormat,
    DataClassification,
    ModelTask,
    PipelineStatus,
    ReportOutcome,
    VersionStatus,
    Visibility,
    WeightsCheck,
)

SHA256 = RegexValidator(r"^[0-9a-f]{64}$", "Must be 64 lowercase hexadecimal characters (a SHA-256 digest).")
VERSION = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$",
    "Letters, digits and . _ + - only, starting with a letter or digit.",
)
ARTIFACT_URI = RegexValidator(
    r"^(s3|gs|file|https?)://\S+$", "Must be an s3://, gs://, file:// or http(s):// URI."
)
RUNTIME_VERSION = RegexValidator(
    r"^\d+\.\d+(\.\d+)?([.+-][A-Za-z0-9.]+)?$", "Must be a version such as 0.33.0."
)
IMAGE = RegexValidator(
    r"^[a-z0-9]+([._/:@-][A-Za-z0-9_.-]+)*$", "Must be a container image such as vllm/vllm-openai:v0.33.0."
)
SERVED_NAME = RegexValidator(r"^[A-Za-z0-9][A-Za-z0-9._/:-]*$", "Letters, digits and . _ / : - only.")
HEX_COMMIT = RegexValidator(r"^[0-9a-f]{7,64}$", "Must be a hexadecimal commit id.")


class RegisteredModel(models.Model):
    """A model family (e.g. ``llama-3-8b-instruct``) owned by a tenant, or by the platform when
    ``owner`` is empty. Catalog models are usable by every tenant; private ones only by their owner.
    ``validation_policy`` is the list of rules a version's evaluation must satisfy (registry.policy).
    """

    name = models.SlugField(max_length=100)
    owner = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="models")
    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.PRIVATE)
    task = models.CharField(max_length=16, choices=ModelTask.choices, default=ModelTask.CHAT)
    description = models.TextField(blank=True, max_length=5000)
    license = models.CharField(max_length=100, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    validation_policy = models.JSONField(default=list, blank=True)
    revision = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="model_unique_name_per_owner"),
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(owner__isnull=True), name="model_unique_platform_name"
            ),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.ref

    @property
    def owner_slug(self) -> str:
        return self.owner.slug if self.owner else "platform"

    @property
    def ref(self) -> str:
        return f"{self.owner_slug}/{self.name}"


class ModelVersion(models.Model):
    """One release of a model: weights, runtime, tokenizer, prompt template and engine arguments.

    Lifecycle (compare-and-set transitions; every move is audited and kept in VersionTransition)::

        draft ─► validating ─► validated ─► staged ─► canary ─► production ─► deprecated ─► retired
                     │                         ▲        │  │                     ▲    │
                     ▼                         └────────┘  └─────────────────────┘    │
                  rejected            (canary aborts to staged)    rollback: production ─► staged,
                                                                   previous deprecated ─► production
        validated, staged, canary ─► deprecated

    Gates: → validated needs a passing validation report; → production needs a succeeded rollout or an
    operator override with a reason; → retired needs no deployment using the version. Release content
    is immutable once the version leaves draft; governance metadata (who may use it, where) stays
    editable because it is policy, and every change to it is audited.
    """

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="versions")
    version = models.CharField(max_length=64, validators=[VERSION])
    status = models.CharField(max_length=16, choices=VersionStatus.choices, default=VersionStatus.DRAFT)
    status_changed_at = models.DateTimeField(default=timezone.now)
    # Artifact
    artifact_uri = models.CharField(max_length=1000, validators=[ARTIFACT_URI])
    artifact_sha256 = models.CharField(max_length=64, validators=[SHA256])
    artifact_size_bytes = models.PositiveBigIntegerField(validators=[MinValueValidator(1)])
    artifact_format = models.CharField(max_length=16, choices=ArtifactFormat.choices)
    artifact_manifest = models.JSONField(default=list, blank=True)
    # Whether ingest saw the declared digests in the source's bytes; replication waits for it (WeightsCheck).
    weights_check = models.CharField(
        max_length=16, choices=WeightsCheck.choices, default=WeightsCheck.PENDING
    )
    # Serving
    served_model_name = models.CharField(max_length=200, validators=[SERVED_NAME])
    runtime_version = models.CharField(max_length=32, validators=[RUNTIME_VERSION])
    runtime_image = models.CharField(max_length=300, validators=[IMAGE])
    tokenizer_ref = models.CharField(max_length=300, blank=True)
    tokenizer_sha256 = models.CharField(max_length=64, blank=True, validators=[SHA256])
    prompt_template_version = models.CharField(max_length=64, blank=True)
    chat_template = models.TextField(blank=True, max_length=20000)
    engine_args = models.JSONField(default=dict, blank=True)
    max_context_length = models.PositiveIntegerField(
        validators=[MinValueValidator(16), MaxValueValidator(10_000_000)]
    )
    # Sizing inputs
    parameter_count = models.PositiveBigIntegerField(validators=[MinValueValidator(1)])
    dtype = models.CharField(max_length=16)
    quantization = models.CharField(max_length=32, blank=True)
    architecture = models.JSONField(default=dict, blank=True)
    sizing_concurrency = models.PositiveIntegerField(
        default=1, validators=[MinValueValidator(1), MaxValueValidator(100_000)]
    )
    # Governance
    data_classification = models.CharField(
        max_length=16, choices=DataClassification.choices, default=DataClassification.INTERNAL
    )
    allowed_jurisdictions = models.JSONField(default=list, blank=True)
    compliance_tags = models.JSONField(default=list, blank=True)
    owner_contact = models.EmailField(blank=True)
    # Provenance
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    created_by_name = models.CharField(max_length=200)
    ci_pipeline_url = models.URLField(max_length=500, blank=True)
    source_commit = models.CharField(max_length=64, blank=True, validators=[HEX_COMMIT])
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "version"], name="version_unique_per_model")]
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.model.ref}@{self.version}"


class VersionTransition(models.Model):
    """One lifecycle move of a version: the timeline shown on the version page."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="transitions")
    from_status = models.CharField(max_length=16, choices=VersionStatus.choices)
    to_status = models.CharField(max_length=16, choices=VersionStatus.choices)
    actor_name = models.CharField(max_length=200)
    reason = models.TextField(blank=True, max_length=2000)
    gate_override = models.BooleanField(default=False)
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["at", "pk"]

    def __str__(self) -> str:
        return f"{self.version}: {self.from_status} → {self.to_status}"


class ValidationReport(models.Model):
    """Evaluation results posted by CI; ``outcome`` and ``evaluation`` are decided by the server."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="reports")
    metrics = models.JSONField(default=dict)
    performance = models.JSONField(default=dict, blank=True)
    hardware = models.JSONField(default=dict, blank=True)
    outcome = models.CharField(max_length=8, choices=ReportOutcome.choices)
    evaluation = models.JSONField(default=list)
    ci_pipeline_url = models.URLField(max_length=500, blank=True)
    created_by_name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"report {self.pk} for {self.version}: {self.outcome}"


class ModelAlias(models.Model):
    """A movable name (``production``, ``canary``, ``staging`` or custom) pointing at one version."""

    model = models.ForeignKey(RegisteredModel, on_delete=models.CASCADE, related_name="aliases")
    name = models.SlugField(max_length=64)
    version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["model", "name"], name="alias_unique_per_model")]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.model.ref}:{self.name}"


class AliasMove(models.Model):
    """Where an alias pointed from ``at`` on; the history answers "which version was X at time T"."""

    alias = models.ForeignKey(ModelAlias, on_delete=models.CASCADE, related_name="moves")
    version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    previous_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_name = models.CharField(max_length=200)
    reason = models.TextField(blank=True, max_length=2000)
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return f"{self.alias} → {self.version} at {self.at:%Y-%m-%d %H:%M}"


class Pipeline(models.Model):
    """A named graph of stages served as one model name (e.g. ``support-rag``), owned by a tenant, or by
    the platform when ``owner`` is empty (the catalog, usable by every tenant)."""

    owner = models.ForeignKey(Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    name = models.SlugField(max_length=63)
    description = models.TextField(blank=True, max_length=2000)
    created_by_name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="pipeline_unique_name_per_owner"),
            models.UniqueConstraint(
                fields=["name"], condition=models.Q(owner__isnull=True), name="pipeline_unique_platform_name"
            ),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.ref

    @property
    def ref(self) -> str:
        return f"{self.owner.slug if self.owner else 'platform'}/{self.name}"


class PipelineVersion(models.Model):
    """One release of a pipeline: its graph (``registry.pipelines``), immutable once out of draft.

    Lifecycle (compare-and-set transitions, each audited)::

        draft ─► production ─► deprecated ─► retired
          │                        │  ▲
          └────────► retired       └──┘ (back to production: a rollback)

    One version of a pipeline is in production at a time: promoting one deprecates the previous.
    """

    pipeline = models.ForeignKey(Pipeline, on_delete=models.CASCADE, related_name="versions")
    version = models.CharField(max_length=64, validators=[VERSION])
    status = models.CharField(max_length=16, choices=PipelineStatus.choices, default=PipelineStatus.DRAFT)
    status_changed_at = models.DateTimeField(default=timezone.now)
    graph = models.JSONField()
    created_by_name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["pipeline", "version"], name="pipeline_version_unique"),
            models.UniqueConstraint(
                fields=["pipeline"],
                condition=models.Q(status="production"),
                name="pipeline_one_production_version",
            ),
        ]
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.pipeline.ref}@{self.version}"


class RetrievalIndex(models.Model):
    """A tenant's small vector index, searched by its pipelines' ``retrieve`` stages (in the gateways). The
    tenant fills it through the API with documents and their vectors, embedded by the same model as its
    pipeline's embedding stage. ``revision`` moves on every change, so gateways know to fetch it again."""

    owner = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    name = models.SlugField(max_length=63)
    dimensions = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(4096)])
    revision = models.PositiveIntegerField(default=0)
    created_by_name = models.CharField(max_length=200)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="index_unique_name_per_owner")]
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.owner.slug}/{self.name}"


class IndexDocument(models.Model):
    """One document of an index: the tenant's key for it, its text (what a prompt is given) and vector."""

    index = models.ForeignKey(RetrievalIndex, on_delete=models.CASCADE, related_name="documents")
    key = models.CharField(max_length=200)
    text = models.TextField(max_length=20_000)
    vector = models.JSONField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["index", "key"], name="document_unique_key_per_index")]
        ordering = ["key"]

    def __str__(self) -> str:
        return f"{self.index}:{self.key}"
