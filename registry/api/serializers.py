"""Input and output shapes of the registry API."""

from typing import Any

from rest_framework import serializers

from core.api.conventions import StrictSerializer
from core.choices import Jurisdiction
from registry.choices import (
    ArtifactFormat,
    DataClassification,
    ModelTask,
    PipelineStatus,
    VersionStatus,
    Visibility,
)
from registry.models import (
    VERSION,
    AliasMove,
    ModelAlias,
    ModelVersion,
    Pipeline,
    PipelineVersion,
    RegisteredModel,
    RetrievalIndex,
    ValidationReport,
    VersionTransition,
)
from registry.pipelines import NAME
from registry.services.models import MODEL_FIELDS
from registry.sizing import sizing_of


class ModelSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner_slug", read_only=True)
    ref = serializers.CharField(read_only=True)
    versions = serializers.SerializerMethodField()
    aliases = serializers.SerializerMethodField()

    class Meta:
        model = RegisteredModel
        fields = [
            "ref",
            "owner",
            *MODEL_FIELDS,
            "revision",
            "versions",
            "aliases",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_versions(self, model: RegisteredModel) -> dict[str, str]:
        return dict(model.versions.order_by("-created_at").values_list("version", "status")[:50])

    def get_aliases(self, model: RegisteredModel) -> dict[str, str | None]:
        return {
            a.name: a.version.version if a.version else None for a in model.aliases.select_related("version")
        }


class ModelWriteSerializer(StrictSerializer):
    owner = serializers.SlugField(max_length=50, help_text='Owner tenant slug, or "platform"')
    name = serializers.SlugField(max_length=100)
    visibility = serializers.ChoiceField(Visibility.choices, required=False)
    task = serializers.ChoiceField(ModelTask.choices, required=False)
    description = serializers.CharField(max_length=5000, required=False, allow_blank=True)
    license = serializers.CharField(max_length=100, required=False, allow_blank=True)
    labels = serializers.DictField(child=serializers.CharField(max_length=200), required=False)
    validation_policy = serializers.ListField(child=serializers.DictField(), required=False)


class ModelUpdateSerializer(ModelWriteSerializer):
    owner = None  # type: ignore[assignment]
    name = None  # type: ignore[assignment]


class ManifestEntrySerializer(StrictSerializer):
    path = serializers.CharField(max_length=500)
    sha256 = serializers.RegexField(r"^[0-9a-fA-F]{64}$", required=False)
    size_bytes = serializers.IntegerField(min_value=0, required=False)


class VersionWriteSerializer(StrictSerializer):
    version = serializers.CharField(max_length=64)
    parent_version = serializers.CharField(max_length=64, required=False, allow_null=True)
    artifact_uri = serializers.CharField(max_length=1000)
    artifact_sha256 = serializers.CharField(max_length=64)
    artifact_size_bytes = serializers.IntegerField(min_value=1)
    artifact_format = serializers.ChoiceField(ArtifactFormat.choices)
    artifact_manifest = ManifestEntrySerializer(many=True, required=False)
    served_model_name = serializers.CharField(max_length=200)
    runtime_version = serializers.CharField(max_length=32)
    runtime_image = serializers.CharField(max_length=300)
    tokenizer_ref = serializers.CharField(max_length=300, required=False, allow_blank=True)
    tokenizer_sha256 = serializers.CharField(max_length=64, required=False, allow_blank=True)
    prompt_template_version = serializers.CharField(max_length=64, required=False, allow_blank=True)
    chat_template = serializers.CharField(
        max_length=20000, required=False, allow_blank=True, trim_whitespace=False
    )
    engine_args = serializers.DictField(required=False)
    max_context_length = serializers.IntegerField(min_value=16, max_value=10_000_000)
    parameter_count = serializers.IntegerField(min_value=1)
    dtype = serializers.CharField(max_length=16)
    quantization = serializers.CharField(max_length=32, required=False, allow_blank=True)
    architecture = serializers.DictField(child=serializers.IntegerField(min_value=1), required=False)
    sizing_concurrency = serializers.IntegerField(min_value=1, max_value=100_000, required=False)
    data_classification = serializers.ChoiceField(DataClassification.choices, required=False)
    allowed_jurisdictions = serializers.ListField(
        child=serializers.ChoiceField(Jurisdiction.choices), required=False
    )
    compliance_tags = serializers.ListField(child=serializers.CharField(max_length=50), required=False)
    owner_contact = serializers.EmailField(required=False, allow_blank=True)
    ci_pipeline_url = serializers.URLField(max_length=500, required=False, allow_blank=True)
    source_commit = serializers.CharField(max_length=64, required=False, allow_blank=True)


class VersionUpdateSerializer(VersionWriteSerializer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)
        for name in ("version", "parent_version"):
            self.fields.pop(name)


class VersionSerializer(serializers.ModelSerializer):
    model = serializers.CharField(source="model.ref", read_only=True)
    parent_version = serializers.CharField(
        source="parent.version", read_only=True, allow_null=True, default=None
    )
    sizing = serializers.SerializerMethodField()

    class Meta:
        model = ModelVersion
        exclude = ["id", "parent"]
        read_only_fields = ["status", "weights_check"]

    def get_sizing(self, version: ModelVersion) -> dict[str, Any]:
        return sizing_of(version)


class TransitionSerializer(serializers.ModelSerializer):
    class Meta:
        model = VersionTransition
        fields = ["from_status", "to_status", "actor_name", "reason", "gate_override", "at"]


class TransitionRequestSerializer(StrictSerializer):
    to = serializers.ChoiceField(VersionStatus.choices)
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    override = serializers.BooleanField(required=False, default=False)


class RollbackRequestSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=2000)


class ReportWriteSerializer(StrictSerializer):
    metrics = serializers.DictField(child=serializers.FloatField())
    performance = serializers.DictField(child=serializers.FloatField(), required=False)
    hardware = serializers.DictField(required=False)
    ci_pipeline_url = serializers.URLField(max_length=500, required=False, allow_blank=True)


class ReportSerializer(serializers.ModelSerializer):
    class Meta:
        model = ValidationReport
        fields = [
            "id",
            "outcome",
            "metrics",
            "performance",
            "hardware",
            "evaluation",
            "ci_pipeline_url",
            "created_by_name",
            "created_at",
        ]


class AliasSerializer(serializers.ModelSerializer):
    version = serializers.CharField(source="version.version", read_only=True, allow_null=True, default=None)

    class Meta:
        model = ModelAlias
        fields = ["name", "version", "updated_at"]


class AliasMoveRequestSerializer(StrictSerializer):
    version = serializers.CharField(max_length=64, allow_null=True)
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class AliasMoveSerializer(serializers.ModelSerializer):
    version = serializers.CharField(source="version.version", read_only=True, allow_null=True, default=None)
    previous_version = serializers.CharField(
        source="previous_version.version", read_only=True, allow_null=True, default=None
    )

    class Meta:
        model = AliasMove
        fields = ["version", "previous_version", "actor_name", "reason", "at"]


class PipelineSerializer(serializers.ModelSerializer):
    ref = serializers.CharField(read_only=True)
    owner = serializers.SerializerMethodField()
    versions = serializers.SerializerMethodField()

    class Meta:
        model = Pipeline
        fields = ["ref", "owner", "name", "description", "versions", "created_by_name", "created_at"]
        read_only_fields = fields

    def get_owner(self, pipeline: Pipeline) -> str:
        return pipeline.owner.slug if pipeline.owner else "platform"

    def get_versions(self, pipeline: Pipeline) -> dict[str, str]:
        return dict(pipeline.versions.order_by("-created_at").values_list("version", "status")[:50])


class PipelineWriteSerializer(StrictSerializer):
    owner = serializers.SlugField(max_length=50, help_text='Owner tenant slug, or "platform"')
    name = serializers.RegexField(NAME.pattern, max_length=63, help_text="lowercase letters, digits, -")
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class PipelineVersionSerializer(serializers.ModelSerializer):
    pipeline = serializers.CharField(source="pipeline.ref", read_only=True)

    class Meta:
        model = PipelineVersion
        fields = [
            "pipeline",
            "version",
            "status",
            "status_changed_at",
            "graph",
            "created_by_name",
            "created_at",
        ]
        read_only_fields = fields


class PipelineVersionWriteSerializer(StrictSerializer):
    version = serializers.RegexField(VERSION.regex, max_length=64)
    graph = serializers.JSONField(help_text="The stages, output and budget_ms (docs/pipelines.md)")


class PipelineGraphSerializer(StrictSerializer):
    graph = serializers.JSONField()


class PipelineTransitionSerializer(StrictSerializer):
    to = serializers.ChoiceField(PipelineStatus.choices)
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class IndexSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.slug", read_only=True)
    documents = serializers.SerializerMethodField()

    class Meta:
        model = RetrievalIndex
        fields = ["owner", "name", "dimensions", "revision", "documents", "created_by_name", "created_at"]
        read_only_fields = fields

    def get_documents(self, index: RetrievalIndex) -> int:
        return index.documents.count()


class IndexWriteSerializer(StrictSerializer):
    owner = serializers.SlugField(max_length=50)
    name = serializers.RegexField(NAME.pattern, max_length=63, help_text="lowercase letters, digits, -")
    dimensions = serializers.IntegerField(min_value=1, max_value=4096)


class DocumentSerializer(StrictSerializer):
    key = serializers.CharField(max_length=200)
    text = serializers.CharField(max_length=20_000)
    vector = serializers.ListField(max_length=4096, help_text="its numbers (checked against the index)")


class DocumentsWriteSerializer(StrictSerializer):
    documents = DocumentSerializer(many=True)
