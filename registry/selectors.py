"""Reads of the registry, narrowed to what the principal may see.

Catalog models (platform-owned, visibility ``catalog``) are visible to anyone holding ``registry:read``
somewhere; private models only to their owner's members and to platform readers.
"""

from datetime import datetime
from typing import NamedTuple, TypeVar

from django.db.models import Q, QuerySet

from core.choices import Scope
from core.errors import NotFound
from core.models import Tenant
from core.principal import Principal
from core.selectors import visible_tenant_ids
from registry.choices import (
    SERVABLE_STATES,
    TENANT_DEPLOYABLE_STATES,
    PipelineStatus,
    ReportOutcome,
    VersionStatus,
    Visibility,
)
from registry.models import (
    AliasMove,
    ModelAlias,
    ModelVersion,
    Pipeline,
    PipelineVersion,
    RegisteredModel,
    RetrievalIndex,
    ValidationReport,
)

M = TypeVar("M", RegisteredModel, Pipeline)


def models_for(principal: Principal) -> QuerySet[RegisteredModel]:
    catalog = Q(owner__isnull=True, visibility=Visibility.CATALOG)
    return _readable(RegisteredModel.objects.select_related("owner"), principal, catalog)


def _readable(queryset: QuerySet[M], principal: Principal, catalog: Q) -> QuerySet[M]:
    """The rows of the principal's tenants, and the platform's ``catalog`` to anyone who reads somewhere."""
    owners = visible_tenant_ids(principal, Scope.REGISTRY_READ)
    if owners is None:
        return queryset
    visible = Q(owner_id__in=owners)
    if Scope.REGISTRY_READ in principal.all_scopes:
        visible |= catalog
    return queryset.filter(visible)


def owned_by(owner: str) -> Q:
    """Rows owned by the tenant of that slug, or by the platform (``platform``)."""
    return Q(owner__isnull=True) if owner == "platform" else Q(owner__slug=owner)


def usable_by(model: RegisteredModel, owner: Tenant | None) -> bool:
    """Whether a tenant's deployments and pipelines (``owner`` None: the platform's) may use the model: its
    own models and the platform catalog's."""
    return model.owner_id == (owner.pk if owner else None) or (
        model.owner_id is None and model.visibility == Visibility.CATALOG
    )


def model_get(principal: Principal, owner: str, name: str) -> RegisteredModel:
    model = models_for(principal).filter(owned_by(owner), name=name).first()
    if model is None:
        raise NotFound(f"No model '{owner}/{name}'.")
    return model


def model_named(ref: str) -> RegisteredModel | None:
    """The model ``<owner>/<name>`` (owner ``platform``: the platform's), whoever may see it: callers
    check ``usable_by``."""
    owner, name = ref.split("/", 1)
    return RegisteredModel.objects.filter(owned_by(owner), name=name).select_related("owner").first()


def stage_version(config: dict[str, str]) -> ModelVersion | None:
    """The version a pipeline's model stage runs now: its pinned version, or where its alias points
    (``config``: the parsed stage's model, and its version or alias)."""
    model = model_named(config["model"])
    if model is None:
        return None
    if "version" in config:
        return model.versions.select_related("model__owner").filter(version=config["version"]).first()
    alias = model.aliases.filter(name=config["alias"]).select_related("version__model__owner").first()
    return alias.version if alias else None


def pipelines_for(principal: Principal) -> QuerySet[Pipeline]:
    """Pipelines the principal may see: its tenants' own, and the platform's (the catalog) to any reader."""
    return _readable(Pipeline.objects.select_related("owner"), principal, Q(owner__isnull=True))


def indexes_for(principal: Principal) -> QuerySet[RetrievalIndex]:
    owners = visible_tenant_ids(principal, Scope.REGISTRY_READ)
    queryset = RetrievalIndex.objects.select_related("owner")
    return queryset if owners is None else queryset.filter(owner_id__in=owners)


def index_get(principal: Principal, owner: str, name: str) -> RetrievalIndex:
    index = indexes_for(principal).filter(owner__slug=owner, name=name).first()
    if index is None:
        raise NotFound(f"No index '{owner}/{name}'.")
    return index


def index_revisions() -> dict[tuple[int, str], int]:
    """(tenant id, index name) → revision of every tenant's indexes: what pipelines' retrieve stages
    search (system use: no caller)."""
    rows = RetrievalIndex.objects.values_list("owner_id", "name", "revision")
    return {(owner, name): revision for owner, name, revision in rows}


def pipelines_in_production() -> QuerySet[PipelineVersion]:
    return PipelineVersion.objects.filter(status=PipelineStatus.PRODUCTION).select_related("pipeline__owner")


def pipeline_get(principal: Principal, owner: str, name: str) -> Pipeline:
    pipeline = pipelines_for(principal).filter(owned_by(owner), name=name).first()
    if pipeline is None:
        raise NotFound(f"No pipeline '{owner}/{name}'.")
    return pipeline


def pipeline_version_get(pipeline: Pipeline, version: str) -> PipelineVersion:
    found = pipeline.versions.select_related("pipeline__owner").filter(version=version).first()
    if found is None:
        raise NotFound(f"No version '{version}' of pipeline {pipeline.ref}.")
    return found


def versions_of(model: RegisteredModel) -> QuerySet[ModelVersion]:
    return model.versions.select_related("model__owner").order_by("-created_at", "-pk")


def version_get(model: RegisteredModel, version: str) -> ModelVersion:
    found = versions_of(model).filter(version=version).first()
    if found is None:
        raise NotFound(f"Model {model.ref} has no version '{version}'.")
    return found


def deployable_states(principal: Principal) -> frozenset[str]:
    """The version states this caller may deploy: operators (deployments:write platform-wide) also staged
    versions, everyone else production and canary ones."""
    return SERVABLE_STATES if principal.sees_all(Scope.DEPLOYMENTS_WRITE) else TENANT_DEPLOYABLE_STATES


def deployable_versions(principal: Principal) -> QuerySet[ModelVersion]:
    """Versions of the models the caller sees, in a state it may deploy."""
    return ModelVersion.objects.filter(
        model__in=models_for(principal), status__in=deployable_states(principal)
    ).select_related("model__owner")


def production_version(model: RegisteredModel) -> ModelVersion | None:
    return model.versions.filter(status=VersionStatus.PRODUCTION).first()


class VersionFile(NamedTuple):
    """One file of a version's weights: its name in the model directory, its content address, its size
    and where ingest fetches it from."""

    path: str
    sha256: str
    size_bytes: int
    source: str


def version_files(version: ModelVersion) -> list[VersionFile]:
    """The one list of a version's files: the manifest's files that declare a SHA-256 (under the artifact
    URI), or else the single artifact (the URI itself, ``model.<format>`` in the model directory)."""
    base = version.artifact_uri.rstrip("/")
    listed = [
        VersionFile(f["path"], f["sha256"], int(f.get("size_bytes", 0)), f"{base}/{f['path']}")
        for f in version.artifact_manifest
        if "sha256" in f
    ]
    single = VersionFile(
        f"model.{version.artifact_format}",
        version.artifact_sha256,
        version.artifact_size_bytes,
        version.artifact_uri,
    )
    return listed or [single]


def latest_report(version: ModelVersion) -> ValidationReport | None:
    return version.reports.order_by("-created_at", "-pk").first()


def production_baseline(model: RegisteredModel) -> tuple[ModelVersion | None, dict[str, float] | None]:
    """The current production version and the metrics of its latest passing report."""
    current = production_version(model)
    if current is None:
        return None, None
    report = current.reports.filter(outcome=ReportOutcome.PASSED).order_by("-created_at", "-pk").first()
    return current, ({**report.metrics, **report.performance} if report else None)


def alias_get(model: RegisteredModel, name: str) -> ModelAlias:
    alias = model.aliases.select_related("version").filter(name=name).first()
    if alias is None:
        raise NotFound(f"Model {model.ref} has no alias '{name}'.")
    return alias


def alias_version_at(alias: ModelAlias, at: datetime) -> ModelVersion | None:
    """Where the alias pointed at time ``at`` (None: nowhere yet, or cleared)."""
    move = (
        AliasMove.objects.filter(alias=alias, at__lte=at)
        .select_related("version")
        .order_by("-at", "-pk")
        .first()
    )
    return move.version if move else None
