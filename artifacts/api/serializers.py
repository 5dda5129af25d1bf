"""Input and output shapes of the artifacts API."""

from rest_framework import serializers

from artifacts.models import ArtifactReplica
from core.api.conventions import StrictSerializer


class ReplicaSerializer(serializers.ModelSerializer):
    version = serializers.CharField(source="version.__str__")
    region = serializers.CharField(source="region.code")
    progress = serializers.IntegerField(read_only=True)

    class Meta:
        model = ArtifactReplica
        fields = [
            "id",
            "version",
            "region",
            "state",
            "progress",
            "bytes_total",
            "bytes_copied",
            "throughput_mbps",
            "attempts",
            "last_error",
            "started_at",
            "finished_at",
        ]


class ReplicaRequestSerializer(StrictSerializer):
    model = serializers.RegexField(r"^[-\w]+/[-\w]+$")
    version = serializers.CharField(max_length=64)
    region = serializers.CharField(max_length=41)
