"""States of a model version's weights in one region's object store."""

from django.db import models


class ReplicaState(models.TextChoices):
    """Where a model version's weights stand in one region's object store."""

    PENDING = "pending", "Pending"
    COPYING = "copying", "Copying"
    VERIFYING = "verifying", "Verifying"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"
    FORBIDDEN = "forbidden", "Forbidden by residency"
