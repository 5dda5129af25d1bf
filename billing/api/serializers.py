"""Input and output shapes of the billing API."""

from decimal import Decimal

from rest_framework import serializers

from billing.models import GpuPrice, UsageRecord


class UsageSerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    deployment = serializers.CharField(source="deployment.name", default=None)

    class Meta:
        model = UsageRecord
        exclude = ["id"]


class PriceSerializer(serializers.ModelSerializer):
    region = serializers.CharField(source="region.code")

    class Meta:
        model = GpuPrice
        fields = ["region", "gpu_type", "pricing_model", "hourly_price", "currency", "effective_from"]


class PriceInputSerializer(serializers.Serializer):
    region = serializers.CharField()
    gpu_type = serializers.CharField(max_length=32)
    pricing_model = serializers.CharField(default="on_demand")
    hourly_price = serializers.DecimalField(max_digits=12, decimal_places=4, min_value=Decimal(0))
    currency = serializers.CharField(default="USD")
    effective_from = serializers.DateTimeField()
