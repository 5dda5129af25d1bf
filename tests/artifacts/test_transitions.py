"""Every replica state change is one compare-and-set along the graph in artifacts.choices."""

import pytest

from artifacts.choices import REPLICA_TRANSITIONS, ReplicaState
from artifacts.models import ArtifactReplica
from artifacts.services.replication import Audited, replica_for, replica_transition
from core.models import AuditEvent
from tests.support.principals import principal
from tests.support.registry import register


@pytest.fixture
def replica(world, chat_model, make_region) -> ArtifactReplica:  # type: ignore[no-untyped-def]
    version = register(chat_model, principal(world.alice), "1.0.0", artifact_manifest=[])
    return replica_for(version, make_region("eu-west-1", "EU"))


def test_a_move_outside_the_graph_is_refused_before_anything_is_written(replica):
    with pytest.raises(ValueError, match="may not move"):
        replica_transition(replica, ReplicaState.READY, source={ReplicaState.PENDING})
    assert ArtifactReplica.objects.get(pk=replica.pk).state == ReplicaState.PENDING


def test_only_the_first_of_two_racing_moves_wins_and_audits(world, replica):
    ArtifactReplica.objects.filter(pk=replica.pk).update(state=ReplicaState.FAILED)
    first, stale = (ArtifactReplica.objects.select_related("version__model").get(pk=replica.pk) for _ in "ab")
    audit = Audited(principal(world.alice), "artifact.replication_retried", "eu-west-1")
    assert replica_transition(first, ReplicaState.PENDING, source={ReplicaState.FAILED}, audit=audit)
    assert not replica_transition(stale, ReplicaState.PENDING, source={ReplicaState.FAILED}, audit=audit)
    assert first.state == ReplicaState.PENDING
    assert stale.state == ReplicaState.FAILED  # the loser's copy in memory is untouched
    assert AuditEvent.objects.filter(action="artifact.replication_retried").count() == 1


def test_every_state_is_reachable_and_forbidden_is_left_only_by_reopening():
    assert set(REPLICA_TRANSITIONS) == set(ReplicaState)
    out_of_forbidden = {to for to, froms in REPLICA_TRANSITIONS.items() if ReplicaState.FORBIDDEN in froms}
    assert out_of_forbidden == {ReplicaState.PENDING}
