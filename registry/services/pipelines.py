"""Defining pipelines: a name, then versions whose graphs are checked (structure, types, the models each
stage may use, the owner's residency) before anything is written, and a compare-and-set lifecycle."""

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from core.choices import Scope
from core.errors import Conflict, InvalidTransition, ValidationFailed
from core.models import Tenant
from core.principal import Principal
from core.residency import processing_refusal, residency_of, residency_refusal, weights_of
from core.services.audit import audit_record, create_audited
from core.services.validation import full_clean
from registry import selectors
from registry.choices import PIPELINE_TRANSITIONS, PipelineStatus
from registry.models import ModelVersion, Pipeline, PipelineVersion, RegisteredModel
from registry.pipelines import SERVED_BY, Graph, Stage, parse_graph

P = PipelineStatus


def pipeline_create(*, actor: Principal, owner: Tenant | None, name: str, description: str = "") -> Pipeline:
    actor.require(Scope.REGISTRY_WRITE, owner.pk if owner else None)
    pipeline = Pipeline(owner=owner, name=name, description=description, created_by_name=actor.name)
    full_clean(pipeline, exclude=["owner"])
    return create_audited(
        actor=actor,
        instance=pipeline,
        action="pipeline.created",
        tenant=owner,
        after={"name": name, "description": description},
        taken=f"Pipeline {pipeline.ref} already exists.",
    )


def pipeline_version_create(
    *, actor: Principal, pipeline: Pipeline, version: str, graph: Any
) -> PipelineVersion:
    actor.require(Scope.REGISTRY_WRITE, pipeline.owner_id)
    parsed = parse_graph(graph)
    check_graph(actor, pipeline, parsed)
    created = PipelineVersion(pipeline=pipeline, version=version, graph=graph, created_by_name=actor.name)
    full_clean(created, exclude=["pipeline"])
    try:
        with transaction.atomic():
            created.save()
            audit_record(
                actor=actor,
                action="pipeline.version_created",
                target=created,
                tenant=pipeline.owner,
                after={"version": version, "graph": graph},
            )
    except IntegrityError:
        raise Conflict(f"{created} already exists.", code="already_exists") from None
    return created


def pipeline_version_update(*, actor: Principal, version: PipelineVersion, graph: Any) -> PipelineVersion:
    """Replace a draft's graph; a version out of draft is immutable (make a new version)."""
    actor.require(Scope.REGISTRY_WRITE, version.pipeline.owner_id)
    check_graph(actor, version.pipeline, parse_graph(graph))
    with transaction.atomic():
        updated = PipelineVersion.objects.filter(pk=version.pk, status=P.DRAFT).update(graph=graph)
        if not updated:
            raise Conflict(
                f"{version} is {version.status}: its graph is immutable; register a new version.",
                code="immutable",
            )
        audit_record(
            actor=actor,
            action="pipeline.version_updated",
            target=version,
            tenant=version.pipeline.owner,
            before={"graph": version.graph},
            after={"graph": graph},
        )
    version.refresh_from_db()
    return version


def pipeline_version_transition(
    *, actor: Principal, version: PipelineVersion, to: str, reason: str = ""
) -> PipelineVersion:
    """Move the version through its lifecycle (compare-and-set). Into production: the graph is checked
    again (a model may have left the catalog since) and the pipeline's previous production version is
    deprecated in the same transaction."""
    actor.require(Scope.REGISTRY_PROMOTE, version.pipeline.owner_id)
    if to not in PIPELINE_TRANSITIONS.get(version.status, frozenset()):
        raise InvalidTransition(f"{version} cannot go from {version.status} to {to}.")
    if to == P.PRODUCTION:
        check_graph(actor, version.pipeline, parse_graph(version.graph))
    try:
        with transaction.atomic():
            if to == P.PRODUCTION:
                current = PipelineVersion.objects.filter(pipeline=version.pipeline, status=P.PRODUCTION)
                for previous in current:
                    _move(actor, previous, P.DEPRECATED, f"superseded by {version.version}")
            _move(actor, version, to, reason)
    except IntegrityError:  # another version went to production at the same moment
        raise InvalidTransition(f"Another version of {version.pipeline} was just promoted; reload.") from None
    version.refresh_from_db()
    return version


def _move(actor: Principal, version: PipelineVersion, to: str, reason: str) -> None:
    moved = PipelineVersion.objects.filter(pk=version.pk, status=version.status).update(
        status=to, status_changed_at=timezone.now()
    )
    if not moved:
        raise InvalidTransition(f"{version} was moved by someone else; reload and try again.")
    audit_record(
        actor=actor,
        action="pipeline.version_transitioned",
        target=version,
        tenant=version.pipeline.owner,
        before={"status": version.status},
        after={"status": to},
        message=reason,
    )


def check_graph(actor: Principal, pipeline: Pipeline, graph: Graph) -> None:
    """What the graph's structure cannot say: each model stage names a model its owner may use, serving
    its task, with a version to run; a stage sending a secret may (``_secret_stage``); and every stage
    can run inside the owner's residency (a platform pipeline's callers are checked when they call it)."""
    for stage in graph.stages.values():
        if "secret" in stage.config:
            _secret_stage(actor, pipeline.owner, stage)
    for stage in graph.model_stages():
        _model_stage(pipeline.owner, stage)
    if pipeline.owner is None:
        return
    residency = residency_of(pipeline.owner)
    for stage in graph.stages.values():
        jurisdiction = stage.config.get("jurisdiction")
        if jurisdiction and (refusal := processing_refusal(residency, jurisdiction)):
            raise _refused(stage, "jurisdiction", refusal)


def _secret_stage(actor: Principal, owner: Tenant | None, stage: Stage) -> None:
    """Whoever chooses where a secret goes chooses who reads it: only the tenant's own pipelines send its
    secrets (a platform pipeline would send every caller's to a service the platform chose), only over
    https, and only written or promoted by someone who may manage the tenant's secrets."""
    if owner is None:
        raise _refused(stage, "secret", "a platform pipeline cannot send tenants' secrets")
    if not stage.config["url"].startswith("https://"):
        raise _refused(stage, "url", "a stage that sends a secret calls an https URL only")
    actor.require(Scope.SECRETS_WRITE, owner.pk)


def _model_stage(owner: Tenant | None, stage: Stage) -> None:
    ref = stage.config["model"]
    model = selectors.model_named(ref)
    if model is None or not selectors.usable_by(model, owner):
        raise _refused(stage, "model", f"no model {ref} that {_whose(owner)} pipelines may use")
    if model.task not in SERVED_BY[stage.config["task"]]:
        raise _refused(
            stage, "task", f"{ref} is a {model.task} model; a {stage.config['task']} stage needs one"
        )
    version = _runs(model, stage)
    if owner is None:
        return
    residency = residency_of(owner)
    if all(residency_refusal(weights_of(version), j, serving=residency) for j in residency.jurisdictions):
        allowed = ", ".join(sorted(version.allowed_jurisdictions)) or "nowhere"
        policy = ", ".join(sorted(residency.jurisdictions))
        raise _refused(
            stage,
            "model",
            f"{version} may be served only in {allowed}, none of it in {owner.slug}'s residency ({policy})",
        )


def _runs(model: RegisteredModel, stage: Stage) -> ModelVersion:
    """The version the stage runs today: its pinned version, or where its alias points."""
    found = selectors.stage_version(stage.config)
    if found is not None:
        return found
    if "version" in stage.config:
        raise _refused(stage, "version", f"{model.ref} has no version {stage.config['version']}")
    raise _refused(stage, "alias", f"{model.ref}'s alias {stage.config['alias']} points at no version")


def _whose(owner: Tenant | None) -> str:
    return f"{owner.slug}'s" if owner else "platform"


def _refused(stage: Stage, field: str, message: str) -> ValidationFailed:
    where = f"stages.{stage.name}.{field}"
    return ValidationFailed(f"Pipeline graph: {where}: {message}", detail={where: [message]})
