"""States, strategies and verdicts of rollouts, and the rollout state machine."""

from django.db import models


class RolloutState(models.TextChoices):
    PENDING = "pending", "Pending"
    PROGRESSING = "progressing", "Progressing"
    PAUSED = "paused", "Paused"
    SUCCEEDED = "succeeded", "Succeeded"
    ABORTED = "aborted", "Aborted"  # stopped by a person; rolled back
    FAILED = "failed", "Failed"  # stopped by the controller (analysis, an unhealthy candidate); rolled back


R = RolloutState
ACTIVE_STATES = frozenset({R.PENDING, R.PROGRESSING, R.PAUSED})
ROLLBACK_STATES = frozenset({R.ABORTED, R.FAILED})
# Compare-and-set moves only (rollouts.services.rollouts.rollout_transition).
ROLLOUT_TRANSITIONS: dict[str, frozenset[str]] = {
    R.PENDING: frozenset({R.PROGRESSING, R.ABORTED, R.FAILED}),
    R.PROGRESSING: frozenset({R.PAUSED, R.SUCCEEDED, R.ABORTED, R.FAILED}),
    R.PAUSED: frozenset({R.PROGRESSING, R.SUCCEEDED, R.ABORTED, R.FAILED}),
    R.SUCCEEDED: frozenset(),
    R.ABORTED: frozenset(),
    R.FAILED: frozenset(),
}


class Strategy(models.TextChoices):
    CANARY = "canary", "Canary"
    BLUE_GREEN = "blue_green", "Blue-green"
    SHADOW = "shadow", "Shadow (mirror)"


class OnFailure(models.TextChoices):
    """Where a rolled-back candidate version goes in the registry."""

    STAGED = "staged", "Back to staged"
    REJECTED = "rejected", "Rejected"


class Verdict(models.TextChoices):
    SUCCESSFUL = "successful", "Successful"
    FAILED = "failed", "Failed"
    INCONCLUSIVE = "inconclusive", "Inconclusive"
