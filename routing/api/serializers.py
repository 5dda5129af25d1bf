"""Shapes of the routing API: the activation a gateway asks for, and the outputs (the route table itself
is ``gateway/contract.py``'s)."""

from rest_framework import serializers

from core.api.conventions import StrictCharField, StrictIntegerField, StrictSerializer
from routing.models import EndpointHealth, ResponseCachePolicy, RoutingEvent


class ActivationSerializer(StrictSerializer):
    """``gateway.contract.Activation``: the route a gateway holds requests for."""

    tenant = StrictCharField(max_length=50)
    model = StrictCharField(max_length=100)
    held = StrictIntegerField(min_value=1, max_value=1_000_000)


class ActivationResultSerializer(serializers.Serializer):
    deployment = serializers.IntegerField(source="deployment.pk")
    region = serializers.CharField()
    replicas = serializers.IntegerField()
    woke = serializers.BooleanField(help_text="false: the region was already starting or running")


class EndpointHealthSerializer(serializers.ModelSerializer):
    region = serializers.CharField(source="region.code")

    class Meta:
        model = EndpointHealth
        fields = [
            "url",
            "region",
            "state",
            "failures",
            "successes",
            "last_error",
            "latency_ms",
            "running",
            "waiting",
            "kv_cache",
            "checked_at",
            "changed_at",
        ]


class RoutingEventSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", default=None)

    class Meta:
        model = RoutingEvent
        fields = ["kind", "tenant", "model_name", "from_region", "to_region", "message", "generation", "at"]


class ResponseCacheSetSerializer(StrictSerializer):
    ttl_seconds = StrictIntegerField(
        min_value=1, max_value=7 * 24 * 3600, help_text="How long an answer is kept"
    )


class ResponseCacheSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", read_only=True)

    class Meta:
        model = ResponseCachePolicy
        fields = ["tenant", "model_name", "ttl_seconds", "updated_at"]
        read_only_fields = fields
