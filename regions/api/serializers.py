"""Input and output shapes of the regions and deployments API."""

from typing import Any

from rest_framework import serializers

from core.api.conventions import StrictSerializer
from regions.drivers.factory import engine_of
from regions.models import Deployment, DeploymentEvent, DeploymentTarget, GpuPool, Region
from regions.selectors import gpus_in_use


class GpuPoolSerializer(serializers.ModelSerializer):
    used = serializers.SerializerMethodField()

    class Meta:
        model = GpuPool
        fields = ["gpu_type", "memory_gib", "gpu_count", "used", "node_labels", "taints"]

    def get_used(self, pool: GpuPool) -> int:
        return gpus_in_use(pool.region, pool.gpu_type)


class RegionSerializer(serializers.ModelSerializer):
    gpu_pools = GpuPoolSerializer(many=True, read_only=True)
    engine = serializers.SerializerMethodField()

    class Meta:
        model = Region
        fields = [
            "code",
            "name",
            "provider",
            "city",
            "latitude",
            "longitude",
            "jurisdiction",
            "certifications",
            "status",
            "driver",
            "engine",
            "prometheus_url",
            "gpu_pools",
        ]

    def get_engine(self, region: Region) -> str:
        return engine_of(region)


class RegionOperatorSerializer(RegionSerializer):
    """Operators also see how the control plane reaches the region (references only, never secrets)."""

    class Meta(RegionSerializer.Meta):
        fields = [*RegionSerializer.Meta.fields, "driver_config", "object_store", "reconcile_concurrency"]


class PoolWriteSerializer(StrictSerializer):
    gpu_type = serializers.CharField(max_length=32)
    memory_gib = serializers.IntegerField(min_value=1, max_value=4096)
    gpu_count = serializers.IntegerField(min_value=0, max_value=100_000)
    node_labels = serializers.DictField(child=serializers.CharField(max_length=63), required=False)
    taints = serializers.ListField(child=serializers.DictField(child=serializers.CharField()), required=False)


class RegionWriteSerializer(StrictSerializer):
    code = serializers.CharField(max_length=41)
    name = serializers.CharField(max_length=200)
    provider = serializers.CharField(max_length=16)
    city = serializers.CharField(max_length=100, required=False, allow_blank=True)
    latitude = serializers.FloatField(required=False, allow_null=True, min_value=-90, max_value=90)
    longitude = serializers.FloatField(required=False, allow_null=True, min_value=-180, max_value=180)
    jurisdiction = serializers.CharField(max_length=2)
    certifications = serializers.ListField(child=serializers.CharField(max_length=16), required=False)
    driver = serializers.CharField(max_length=16)
    driver_config = serializers.DictField(required=False)
    object_store = serializers.DictField(required=False)
    prometheus_url = serializers.URLField(required=False, allow_blank=True)
    gpu_pools = PoolWriteSerializer(many=True, required=False)


class RegionStatusSerializer(StrictSerializer):
    status = serializers.CharField(max_length=16)
    reason = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")


class TargetSerializer(serializers.ModelSerializer):
    region = serializers.CharField(source="region.code")
    jurisdiction = serializers.CharField(source="region.jurisdiction")

    class Meta:
        model = DeploymentTarget
        fields = [
            "region",
            "jurisdiction",
            "desired_replicas",
            "status",
            "ready_replicas",
            "endpoints",
            "last_error",
            "last_transition_at",
            "observed_generation",
            "attempts",
            "next_attempt_at",
            "cold_starts",
        ]


class EventSerializer(serializers.ModelSerializer):
    region = serializers.CharField(source="region.code", default=None, allow_null=True)

    class Meta:
        model = DeploymentEvent
        fields = ["at", "region", "kind", "message"]


class DeploymentSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.slug")
    model = serializers.CharField(source="model.ref")
    version = serializers.CharField(source="version.version")
    targets = serializers.SerializerMethodField()

    class Meta:
        model = Deployment
        fields = [
            "owner",
            "name",
            "model",
            "version",
            "follow_alias",
            "placement_mode",
            "min_regions",
            "replicas",
            "min_replicas",
            "max_replicas",
            "gpu_type",
            "gpu_count",
            "engine_overrides",
            "shared",
            "fallbacks",
            "state",
            "generation",
            "created_by_name",
            "created_at",
            "updated_at",
            "targets",
        ]

    def get_targets(self, deployment: Deployment) -> list[dict[str, Any]]:
        targets = deployment.targets.select_related("region").exclude(status="deleted")
        return TargetSerializer(targets, many=True).data  # type: ignore[return-value]


class DeploymentWriteSerializer(StrictSerializer):
    owner = serializers.SlugField(max_length=50)
    name = serializers.SlugField(max_length=40)
    model = serializers.RegexField(r"^[-\w]+/[-\w]+$", help_text="owner/name, e.g. platform/tiny-llama")
    version = serializers.CharField(max_length=64, required=False, allow_blank=True)
    follow_alias = serializers.SlugField(max_length=64, required=False, allow_blank=True)
    regions = serializers.ListField(
        child=serializers.CharField(max_length=41),
        required=False,
        allow_null=True,
        help_text="Explicit regions; omit to place in every compliant region",
    )
    min_regions = serializers.IntegerField(min_value=1, max_value=64, required=False)
    replicas = serializers.IntegerField(min_value=1, max_value=64, required=False)
    gpu_type = serializers.CharField(max_length=32, required=False, allow_blank=True)
    gpu_count = serializers.IntegerField(min_value=1, max_value=64, required=False)
    engine_overrides = serializers.DictField(required=False)
    shared = serializers.BooleanField(
        required=False,
        help_text="Platform operators: serve a catalog model to every tenant, billed by tokens",
    )


class ScaleSerializer(StrictSerializer):
    replicas = serializers.IntegerField(min_value=0, max_value=64)


class FallbacksSerializer(StrictSerializer):
    fallbacks = serializers.ListField(
        child=serializers.SlugField(max_length=40),
        max_length=5,
        allow_empty=True,
        help_text="Other model names of the same tenant, tried in order when this one cannot serve",
    )
