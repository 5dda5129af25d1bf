"""Replicas: a model version's weights, verified, in one region's object store."""

from django.db import models
from django.utils import timezone

from artifacts.choices import ReplicaState
from regions.models import Region
from registry.models import ModelVersion


class ArtifactReplica(models.Model):
    """A model version's weights, verified, in one region's object store.

    pending → copying → verifying → ready;  copying/verifying → failed → (retry) pending;
    any → forbidden when residency (``core.residency``) does not let the version be stored in the
    region: outside its allowed jurisdictions or, for a private version, outside its owner's residency;
    forbidden → pending when a changed policy allows it again (the periodic pass checks every replica).
    Every state change is a compare-and-set (``artifacts.services.replication.replica_transition``).
    ``upload_ids`` remembers the multipart upload of each blob so a copy resumes after a crash.
    """

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="replicas")
    region = models.ForeignKey(Region, on_delete=models.CASCADE, related_name="replicas")
    state = models.CharField(max_length=16, choices=ReplicaState.choices, default=ReplicaState.PENDING)
    bytes_total = models.PositiveBigIntegerField(default=0)
    bytes_copied = models.PositiveBigIntegerField(default=0)
    throughput_mbps = models.FloatField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    upload_ids = models.JSONField(default=dict, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "regions_artifactreplica"  # the table was made when replicas lived in regions; data kept
        constraints = [models.UniqueConstraint(fields=["version", "region"], name="replica_unique_region")]
        ordering = ["version__model__name", "version__version", "region__code"]

    def __str__(self) -> str:
        return f"{self.version}@{self.region.code}"

    @property
    def progress(self) -> int:
        return int(100 * self.bytes_copied / self.bytes_total) if self.bytes_total else 0
