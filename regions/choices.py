"""Statuses and kinds of regions and deployments, and the deployment-per-region state machine."""

from django.db import models


class Provider(models.TextChoices):
    AWS = "aws", "AWS"
    GCP = "gcp", "Google Cloud"
    AZURE = "azure", "Azure"
    OCI = "oci", "Oracle Cloud"
    ON_PREM = "on-prem", "On premises"
    LOCAL = "local", "Local machine"


class RegionStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    DRAINING = "draining", "Draining"
    DISABLED = "disabled", "Disabled"


class DriverKind(models.TextChoices):
    KUBERNETES = "kubernetes", "Kubernetes"
    PROCESS = "process", "Processes on hosts"


class Certification(models.TextChoices):
    GDPR = "GDPR", "GDPR"
    HIPAA = "HIPAA", "HIPAA"
    SOC2 = "SOC2", "SOC 2"
    ISO27001 = "ISO27001", "ISO 27001"
    PCI_DSS = "PCI-DSS", "PCI DSS"
    C5 = "C5", "BSI C5"


class PlacementMode(models.TextChoices):
    EXPLICIT = "explicit", "Explicit regions"
    POLICY = "policy", "Every compliant region"


class DeploymentState(models.TextChoices):
    ACTIVE = "active", "Active"
    DELETING = "deleting", "Deleting"
    DELETED = "deleted", "Deleted"


class TargetStatus(models.TextChoices):
    """What a deployment looks like in one region, as last observed by the reconciler."""

    PENDING = "pending", "Pending"
    WAITING = "waiting", "Waiting for artifacts"
    PROVISIONING = "provisioning", "Provisioning"
    READY = "ready", "Ready"
    DEGRADED = "degraded", "Degraded"
    FAILED = "failed", "Failed"
    PAUSED = "paused", "Paused"
    DELETING = "deleting", "Deleting"
    DELETED = "deleted", "Deleted"


class TargetRole(models.TextChoices):
    """Which revision of a deployment a target runs in its region. A rollout adds a candidate beside the
    stable revision; whichever loses (the baseline after a promotion, the candidate after a rollback)
    becomes retiring: out of the route table at once, its workload removed after ``remove_after``."""

    STABLE = "stable", "Stable"
    CANDIDATE = "candidate", "Candidate"
    RETIRING = "retiring", "Retiring"


class TargetPurpose(models.TextChoices):
    """Who pays for a target's GPUs: the tenant (serving), or the platform (a shadow candidate)."""

    SERVING = "serving", "Serving"
    EVALUATION = "evaluation", "Evaluation"


FINAL_TARGET_STATES = frozenset({TargetStatus.DELETED})
