"""Shapes of the autoscaling API. Input is validated by ``autoscaling.policy`` (one validator for the API,
the console and the CLI); the write serializer here documents it."""

from rest_framework import serializers

from autoscaling.choices import ScalerMode
from autoscaling.models import ScalingDecision
from autoscaling.policy import Policy

DEFAULTS = Policy()


class PolicyFieldsSerializer(serializers.Serializer):
    min_replicas = serializers.IntegerField(min_value=0, max_value=64, default=DEFAULTS.min_replicas)
    max_replicas = serializers.IntegerField(min_value=1, max_value=64, default=DEFAULTS.max_replicas)
    waiting = serializers.FloatField(
        required=False, allow_null=True, help_text="vllm:num_requests_waiting per replica"
    )
    running = serializers.FloatField(
        required=False, allow_null=True, help_text="vllm:num_requests_running per replica"
    )
    kv_cache = serializers.FloatField(
        required=False, allow_null=True, help_text="vllm:kv_cache_usage_perc, 0..1, averaged"
    )
    ttft_p95_seconds = serializers.FloatField(
        required=False, allow_null=True, help_text="p95 time to first token over the window (an SLO)"
    )
    tolerance = serializers.FloatField(default=DEFAULTS.tolerance)
    window_seconds = serializers.IntegerField(default=DEFAULTS.window_seconds)
    scale_up_stabilization_seconds = serializers.IntegerField(default=DEFAULTS.scale_up_stabilization_seconds)
    scale_down_stabilization_seconds = serializers.IntegerField(
        default=DEFAULTS.scale_down_stabilization_seconds
    )
    scale_up_percent = serializers.IntegerField(default=DEFAULTS.scale_up_percent)
    scale_up_replicas = serializers.IntegerField(default=DEFAULTS.scale_up_replicas)
    scale_up_period_seconds = serializers.IntegerField(default=DEFAULTS.scale_up_period_seconds)
    scale_down_replicas = serializers.IntegerField(default=DEFAULTS.scale_down_replicas)
    scale_down_period_seconds = serializers.IntegerField(default=DEFAULTS.scale_down_period_seconds)
    idle_seconds = serializers.IntegerField(default=DEFAULTS.idle_seconds)


class PolicyWriteSerializer(PolicyFieldsSerializer):
    mode = serializers.ChoiceField(choices=ScalerMode.choices, default=ScalerMode.CONTROL_PLANE)
    enabled = serializers.BooleanField(default=True)
    overrides = serializers.DictField(
        child=serializers.DictField(), required=False, help_text="{region code: {policy field: value}}"
    )


class PolicySerializer(serializers.Serializer):
    mode = serializers.CharField()
    enabled = serializers.BooleanField()
    spec = PolicyFieldsSerializer()
    overrides = serializers.DictField(child=serializers.DictField())
    updated_by = serializers.CharField(source="updated_by_name")
    updated_at = serializers.DateTimeField()


class RegionScalingSerializer(serializers.Serializer):
    region = serializers.CharField()
    replicas = serializers.IntegerField()
    ready = serializers.IntegerField()
    wakes_on_request = serializers.BooleanField(help_text="at zero because idle: a request wakes it")
    overflow_of = serializers.CharField(help_text="the region whose overflow this one takes ('' if none)")
    signals = serializers.DictField(child=serializers.FloatField())
    limited = serializers.CharField(help_text="why it cannot grow ('' when it can)")


class DecisionSerializer(serializers.ModelSerializer):
    region = serializers.CharField(source="region.code")

    class Meta:
        model = ScalingDecision
        fields = ["at", "region", "kind", "from_replicas", "to_replicas", "reason", "signals"]


class ScalingSerializer(serializers.Serializer):
    policy = PolicySerializer(allow_null=True)
    capacity_limited = serializers.CharField()
    regions = RegionScalingSerializer(many=True)
    decisions = DecisionSerializer(many=True)


class DecisionListSerializer(DecisionSerializer):
    deployment = serializers.SerializerMethodField()

    class Meta(DecisionSerializer.Meta):
        fields = ["id", "deployment", *DecisionSerializer.Meta.fields]

    def get_deployment(self, decision: ScalingDecision) -> str:
        return str(decision.deployment)
