"""States of a model version's weights in one region's object store, and the transitions between them."""

from django.db import models


class ReplicaState(models.TextChoices):
    """Where a model version's weights stand in one region's object store."""

    PENDING = "pending", "Pending"
    COPYING = "copying", "Copying"
    VERIFYING = "verifying", "Verifying"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"
    FORBIDDEN = "forbidden", "Forbidden by residency"


S = ReplicaState
_ALL = frozenset(S)

# Into each state, from which (the graph in ArtifactReplica's docstring). A copy claims a replica in any
# state but ready and forbidden: pending, failed (a retry), or copying/verifying under an expired lease
# (its worker died; the copy resumes). Residency forbids from any state, and a copy's failure is recorded
# whatever it raced with, except a forbidden replica, which stays forbidden.
REPLICA_TRANSITIONS: dict[ReplicaState, frozenset[ReplicaState]] = {
    S.PENDING: frozenset({S.FAILED, S.FORBIDDEN}),  # retried by an operator; allowed again by residency
    S.COPYING: frozenset({S.PENDING, S.COPYING, S.VERIFYING, S.FAILED}),
    S.VERIFYING: frozenset({S.COPYING}),
    S.READY: frozenset({S.VERIFYING}),
    S.FAILED: _ALL - {S.FORBIDDEN},
    S.FORBIDDEN: _ALL - {S.FORBIDDEN},
}
