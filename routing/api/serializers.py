"""Output shapes of the routing API (the route table itself is ``gateway/contract.py``'s)."""

from rest_framework import serializers

from routing.models import EndpointHealth, RoutingEvent


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
