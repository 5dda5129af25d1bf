"""The version lifecycle: every transition and gate, rollback, aliases and their history, audit."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from core.errors import Conflict, Forbidden, InvalidTransition, ValidationFailed
from core.models import AuditEvent
from registry import selectors
from registry.choices import VERSION_TRANSITIONS, VersionStatus
from registry.hooks import USAGE_CHECKERS
from registry.models import AliasMove, ModelVersion, VersionTransition
from registry.services.lifecycle import alias_move, model_rollback, version_transition
from registry.services.reports import report_submit
from tests.support.principals import principal
from tests.support.registry import GOOD_METRICS, advance, register

S = VersionStatus
ALL_PAIRS = [(a, b) for a in S.values for b in S.values if a != b]


def put_in_state(version: ModelVersion, state: str) -> ModelVersion:
    """Force a state directly (test setup only) to test each edge of the graph from it."""
    ModelVersion.objects.filter(pk=version.pk).update(status=state)
    version.refresh_from_db()
    return version


@pytest.mark.parametrize(("start", "to"), ALL_PAIRS)
def test_every_edge_of_the_graph(world, chat_model, start, to):
    actor = principal(world.alice)
    version = put_in_state(register(chat_model, actor), start)
    report_submit(actor=actor, version=put_in_state(version, S.DRAFT), **GOOD_METRICS)
    put_in_state(version, start)
    if to in VERSION_TRANSITIONS[start]:
        version_transition(actor=actor, version=version, to=to, reason="test", override=to == S.PRODUCTION)
        assert ModelVersion.objects.get(pk=version.pk).status == to
        assert VersionTransition.objects.filter(version=version, from_status=start, to_status=to).count() == 1
    else:
        with pytest.raises(InvalidTransition) as err:
            version_transition(actor=actor, version=version, to=to, reason="test", override=True)
        assert err.value.status == 409 and err.value.detail["current"] == start
        assert ModelVersion.objects.get(pk=version.pk).status == start


def test_happy_path_writes_one_audit_event_and_history_row_per_transition(world, chat_model):
    actor = principal(world.alice)
    version = register(chat_model, actor)
    before = AuditEvent.objects.count()
    advance(version, actor, "production")
    transitions = AuditEvent.objects.filter(action="model_version.transitioned", target_id=str(version.pk))
    assert transitions.count() == 5
    assert AuditEvent.objects.count() == before + 6  # five transitions and one validation report
    assert list(version.transitions.values_list("to_status", flat=True)) == [
        "validating",
        "validated",
        "staged",
        "canary",
        "production",
    ]
    assert version.transitions.get(to_status="production").gate_override is True


def test_validated_needs_a_passing_report(world, chat_model):
    actor = principal(world.alice)
    version = register(chat_model, actor)
    version_transition(actor=actor, version=version, to=S.VALIDATING)
    with pytest.raises(Conflict, match="no validation report"):
        version_transition(actor=actor, version=version, to=S.VALIDATED)
    report_submit(
        actor=actor, version=version, metrics={"mmlu": 0.4}, performance=GOOD_METRICS["performance"]
    )
    with pytest.raises(Conflict, match="failed"):
        version_transition(actor=actor, version=version, to=S.VALIDATED)
    report_submit(actor=actor, version=version, **GOOD_METRICS)
    version_transition(actor=actor, version=version, to=S.VALIDATED)
    assert version.status == S.VALIDATED


def test_production_needs_an_override_with_a_reason_by_an_operator_or_tenant_admin(world, chat_model):
    version = advance(register(chat_model, principal(world.alice)), principal(world.alice), "canary")
    with pytest.raises(Conflict, match="succeeded rollout"):
        version_transition(actor=principal(world.alice), version=version, to=S.PRODUCTION)
    with pytest.raises(ValidationFailed, match="reason"):
        version_transition(actor=principal(world.alice), version=version, to=S.PRODUCTION, override=True)
    with pytest.raises(Forbidden, match="override"):
        version_transition(
            actor=principal(world.dave),
            version=version,
            to=S.PRODUCTION,
            override=True,
            reason="developers may promote but not skip gates",
        )
    version_transition(
        actor=principal(world.operator),
        version=version,
        to=S.PRODUCTION,
        override=True,
        reason="canary looked fine on dashboards",
    )
    assert ModelVersion.objects.get(pk=version.pk).status == S.PRODUCTION


def test_retire_is_refused_while_something_uses_the_version(world, chat_model):
    actor = principal(world.alice)
    version = advance(register(chat_model, actor), actor, "staged")
    version_transition(actor=actor, version=version, to=S.DEPRECATED)

    def checker(v):
        return ["deployment acme/chat in eu-west-1"] if v.pk == version.pk else []

    USAGE_CHECKERS.append(checker)
    try:
        with pytest.raises(Conflict, match="still used by deployment acme/chat"):
            version_transition(actor=actor, version=version, to=S.RETIRED)
    finally:
        USAGE_CHECKERS.remove(checker)
    version_transition(actor=actor, version=version, to=S.RETIRED)
    assert version.status == S.RETIRED


def test_promoting_deprecates_the_previous_production_and_moves_aliases(world, chat_model):
    actor = principal(world.alice)
    first = advance(register(chat_model, actor, "1.0.0"), actor, "production")
    second = advance(register(chat_model, actor, "1.1.0"), actor, "production")
    first.refresh_from_db()
    assert first.status == S.DEPRECATED and second.status == S.PRODUCTION
    aliases = {a.name: a.version.version if a.version else None for a in chat_model.aliases.all()}
    assert aliases == {"staging": None, "canary": None, "production": "1.1.0"}


def test_rollback_restores_the_previous_production(world, chat_model):
    actor = principal(world.alice)
    first = advance(register(chat_model, actor, "1.0.0"), actor, "production")
    second = advance(register(chat_model, actor, "1.1.0"), actor, "production")
    before = AuditEvent.objects.count()
    restored = model_rollback(actor=actor, model=chat_model, reason="1.1.0 hallucinates prices")
    first.refresh_from_db()
    second.refresh_from_db()
    assert restored.pk == first.pk and first.status == S.PRODUCTION and second.status == S.STAGED
    assert selectors.alias_get(chat_model, "production").version_id == first.pk
    assert AuditEvent.objects.count() == before + 1
    with pytest.raises(Conflict, match="no earlier production"):
        model_rollback(actor=actor, model=chat_model, reason="again")


def test_rollback_without_history_is_409(world, chat_model):
    with pytest.raises(Conflict):
        model_rollback(actor=principal(world.alice), model=chat_model, reason="nothing there")


def test_alias_history_answers_where_it_pointed_at_a_time(world, chat_model):
    actor = principal(world.alice)
    v1 = advance(register(chat_model, actor, "1.0.0"), actor, "validated")
    v2 = advance(register(chat_model, actor, "2.0.0"), actor, "validated")
    alias_move(actor=actor, model=chat_model, name="stable", version=v1, reason="first")
    alias_move(actor=actor, model=chat_model, name="stable", version=v2, reason="second")
    moves = list(AliasMove.objects.filter(alias__name="stable").order_by("at"))
    t0 = timezone.now()
    AliasMove.objects.filter(pk=moves[0].pk).update(at=t0 - timedelta(days=10))
    AliasMove.objects.filter(pk=moves[1].pk).update(at=t0 - timedelta(days=5))
    stable = selectors.alias_get(chat_model, "stable")
    assert selectors.alias_version_at(stable, t0 - timedelta(days=11)) is None
    assert selectors.alias_version_at(stable, t0 - timedelta(days=7)).pk == v1.pk
    assert selectors.alias_version_at(stable, t0).pk == v2.pk


def test_builtin_aliases_cannot_be_moved_by_hand_and_drafts_cannot_be_aliased(world, chat_model):
    actor = principal(world.alice)
    draft = register(chat_model, actor)
    with pytest.raises(Conflict, match="follows the lifecycle"):
        alias_move(actor=actor, model=chat_model, name="production", version=draft)
    with pytest.raises(Conflict, match="draft"):
        alias_move(actor=actor, model=chat_model, name="stable", version=draft)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row-level races need PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_parallel_promotions_have_exactly_one_winner(world, chat_model):
    actor = principal(world.alice)
    version = advance(register(chat_model, actor), actor, "staged")
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def promote() -> None:
        mine = ModelVersion.objects.get(pk=version.pk)
        barrier.wait()
        try:
            version_transition(actor=actor, version=mine, to=S.CANARY, reason="race")
            outcomes.append("won")
        except InvalidTransition as exc:
            outcomes.append(f"409:{exc.detail['current']}")
        finally:
            connection.close()

    threads = [threading.Thread(target=promote) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["409:canary"] * 5 + ["won"]
    assert VersionTransition.objects.filter(version=version, to_status=S.CANARY).count() == 1
    assert AuditEvent.objects.filter(action="model_version.transitioned", after__status="canary").count() == 1
