"""Where each stage of a pipeline runs for one tenant, now: the deployment (and its regions) serving a
model stage, the jurisdiction of an ``http`` stage, the gateway for built-ins; and why a stage cannot run
inside the tenant's residency. Read by the pipeline page; the same rule as the definition's check
(``core.residency``), applied to the tenant calling."""

import logging
from dataclasses import dataclass
from typing import Any

from core.models import Tenant
from core.residency import processing_refusal, residency_of
from core.services.secrets import secret_versions
from gateway import contract
from regions.choices import DeploymentState
from regions.models import Deployment
from regions.selectors import processing_regions, region_jurisdictions
from registry import selectors as registry_selectors
from registry.models import ModelVersion, PipelineVersion
from registry.pipelines import REDACTIONS, Graph, Stage, parse_graph

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagePlan:
    stage: str
    kind: str
    serves: str  # what runs it: a deployment, a service and its jurisdiction, the gateway
    regions: tuple[str, ...] = ()  # a model stage's regions with an engine up, in the route's order
    refusal: str = ""  # why it cannot run for this tenant now ('' when it can)
    route: str = ""  # a model stage: the tenant's model name the gateway calls for it
    revision: int = 0  # a retrieve stage: its index's revision
    secret_version: str = ""  # an http stage with a secret: the secret's version


class Facts:
    """What resolving pipelines reads from the database, read once for a whole publish (every tenant, every
    pipeline) instead of once per tenant and stage: a catalog pipeline used by thousands of tenants costs
    a few queries, not a few per tenant. The rules stay where they are; this only remembers their inputs."""

    def __init__(self) -> None:
        self.graphs: dict[int, Graph] = {}
        self.versions: dict[tuple[str, ...], ModelVersion | None] = {}
        self.deployments: dict[int, list[Deployment]] = {}
        self._indexes: dict[tuple[int, str], int] | None = None
        self._secrets: dict[tuple[int, str], str] | None = None

    def graph(self, version: PipelineVersion) -> Graph:
        if version.pk not in self.graphs:
            self.graphs[version.pk] = parse_graph(version.graph)
        return self.graphs[version.pk]

    def stage_version(self, config: dict[str, Any]) -> ModelVersion | None:
        key = (config["model"], config.get("version", ""), config.get("alias", ""))
        if key not in self.versions:
            self.versions[key] = registry_selectors.stage_version(config)
        return self.versions[key]

    def serving(self, tenant: Tenant, version: ModelVersion) -> list[Deployment]:
        """The active deployments of ``version`` the tenant may call: its own first, then shared ones."""
        if version.pk not in self.deployments:
            active = Deployment.objects.filter(state=DeploymentState.ACTIVE, version=version)
            self.deployments[version.pk] = list(active)  # every tenant's: narrowed per tenant below
        usable = [d for d in self.deployments[version.pk] if d.owner_id == tenant.pk or d.shared]
        return sorted(usable, key=lambda d: (d.owner_id != tenant.pk, d.name))

    def index_revision(self, tenant: Tenant, name: str) -> int | None:
        if self._indexes is None:
            self._indexes = registry_selectors.index_revisions()
        return self._indexes.get((tenant.pk, name))

    def secret_version(self, tenant: Tenant, name: str) -> str | None:
        if self._secrets is None:
            self._secrets = secret_versions()
        return self._secrets.get((tenant.pk, name))


def pipeline_plan(
    tenant: Tenant, version: PipelineVersion, table: contract.RouteTable, facts: Facts | None = None
) -> list[StagePlan]:
    facts = facts or Facts()
    view = table.get("tenants", {}).get(tenant.slug)
    routes = view["models"] if view else {}
    return [_plan(tenant, stage, routes, facts) for stage in facts.graph(version).stages.values()]


def _plan(tenant: Tenant, stage: Stage, routes: dict[str, contract.Route], facts: Facts) -> StagePlan:
    if stage.kind == "model":
        return _model_plan(tenant, stage, routes, facts)
    if stage.kind == "http":
        jurisdiction = stage.config["jurisdiction"]
        refusal = processing_refusal(residency_of(tenant), jurisdiction) or ""
        secret, version = stage.config.get("secret"), ""
        if secret and not refusal:  # the calling tenant's own secret of that name
            version = facts.secret_version(tenant, secret) or ""
            refusal = "" if version else f"{tenant.slug} has no secret {secret}"
        serves = f"{stage.config['url']} ({jurisdiction})"
        return StagePlan(stage.name, stage.kind, serves, refusal=refusal, secret_version=version)
    if stage.kind == "retrieve":
        # The calling tenant's own index of that name (a platform pipeline's too: each tenant's documents
        # stay its own).
        held = facts.index_revision(tenant, stage.config["index"])
        serves = f"index {stage.config['index']} (in the gateway)"
        if held is None:
            return StagePlan(
                stage.name, stage.kind, serves, refusal=f"{tenant.slug} has no index {stage.config['index']}"
            )
        return StagePlan(stage.name, stage.kind, serves, revision=held)
    return StagePlan(stage.name, stage.kind, "the gateway")


def _model_plan(tenant: Tenant, stage: Stage, routes: dict[str, contract.Route], facts: Facts) -> StagePlan:
    version = facts.stage_version(stage.config)
    if version is None:
        return StagePlan(stage.name, stage.kind, stage.config["model"], refusal="no version to run")
    for deployment in facts.serving(tenant, version):
        route = routes.get(deployment.name)
        # The tenant's route of that name may be another deployment of its own (its own names shadow the
        # shared ones): only a route whose engines are this deployment's serves the stage.
        if route is None or any(e["deployment"] != deployment.pk for e in route["endpoints"]):
            continue
        regions = tuple(dict.fromkeys(e["region"] for e in route["endpoints"]))
        # At zero (idle): the stage's request wakes it and is held, as a direct request would be.
        waking = "activatable" in route
        refusal = "" if regions or waking else route.get("unavailable", "no engine is up")
        serves = f"deployment {deployment.name} ({version})"
        return StagePlan(stage.name, stage.kind, serves, regions, refusal, route=deployment.name)
    return StagePlan(
        stage.name, stage.kind, str(version), refusal=f"no deployment of {version} serves {tenant.slug}"
    )


def attach_pipelines(tenants: dict[str, contract.TenantRoutes]) -> None:
    """Add each tenant's pipelines in production (its own, and the platform's catalog) to its view of the
    route table, under the model name clients call them by. A name the tenant already calls a model by
    stays the model's. A pipeline with a stage that cannot run for the tenant now is listed unavailable,
    naming the stage: the gateway refuses it (503) and never spills a stage out of residency."""
    versions = list(registry_selectors.pipelines_in_production())
    if not versions:
        return
    by_slug = {t.slug: t for t in Tenant.objects.filter(slug__in=tenants)}
    facts, places = Facts(), region_jurisdictions()
    for slug, view in tenants.items():
        tenant = by_slug.get(slug)
        if tenant is None:
            continue
        mine = [v for v in versions if v.pipeline.owner_id in (None, tenant.pk)]
        # The tenant's own pipeline of a name wins over the catalog's, as its own deployments do.
        mine.sort(key=lambda v: v.pipeline.owner_id is not None)
        named = {v.pipeline.name: v for v in mine if v.pipeline.name not in view["models"]}
        regions = sorted(processing_regions(tenant, places)) if named else []
        routes = {name: _safely(tenant, v, view, regions, facts) for name, v in named.items()}
        if routes:
            view["pipelines"] = routes


def _safely(
    tenant: Tenant, version: PipelineVersion, view: contract.TenantRoutes, regions: list[str], facts: Facts
) -> contract.PipelineRoute:
    """The pipeline's route, or, should resolving it fail, the pipeline unavailable: one pipeline never
    stops the table (every tenant's routes and failovers) from being published."""
    try:
        route = _route(tenant, version, view, facts)
        route["regions"] = regions  # where a gateway may run its own stages on the tenant's data
        return route
    except Exception:
        log.exception("resolving %s for %s failed", version, tenant.slug)
        broken: contract.PipelineRoute = {"version": str(version), "budget_ms": 0, "output": [], "stages": []}
        broken["unavailable"] = "it cannot be resolved now"
        return broken


def _route(
    tenant: Tenant, version: PipelineVersion, view: contract.TenantRoutes, facts: Facts
) -> contract.PipelineRoute:
    graph = facts.graph(version)
    plans = {p.stage: p for p in pipeline_plan(tenant, version, {"tenants": {tenant.slug: view}}, facts)}
    route: contract.PipelineRoute = {
        "version": str(version),
        "budget_ms": graph.budget_ms,
        "output": list(graph.output),
        "stages": [],
    }
    refused = next((p for p in plans.values() if p.refusal), None)
    if refused is not None:
        route["unavailable"] = f"stage {refused.stage}: {refused.refusal}"
        return route
    route["stages"] = [_stage(stage, plans[stage.name]) for stage in graph.stages.values()]
    return route


def _stage(stage: Stage, plan: StagePlan) -> contract.PipelineStage:
    wire: contract.PipelineStage = {
        "name": stage.name,
        "kind": stage.kind,
        "inputs": dict(stage.inputs),
        "output": stage.output,
        "timeout_ms": stage.timeout_ms,
        "on_failure": stage.on_failure,
    }
    if stage.on_failure == "skip":
        wire["passes"] = stage.passes
    if stage.labels:
        wire["labels"] = sorted(stage.labels)
    if stage.when is not None:
        wire["when"] = {
            "stage": stage.when.stage,
            "labels": sorted(stage.when.labels),
            "otherwise": stage.when.otherwise,
        }
    config = stage.config
    if stage.kind == "model":
        wire["route"], wire["task"] = plan.route, config["task"]
        for optional in ("max_tokens", "top_n"):
            if optional in config:
                wire[optional] = config[optional]  # type: ignore[literal-required]
    elif stage.kind == "http":
        wire["url"], wire["jurisdiction"] = config["url"], config["jurisdiction"]
        if "secret" in config:  # its name and revision: only the gateways' copy of the table has its value
            wire["secret"], wire["secret_version"] = config["secret"], plan.secret_version
    elif stage.kind == "redact":
        wire["patterns"] = [REDACTIONS[p] if isinstance(p, str) else p["regex"] for p in config["patterns"]]
        wire["replacement"] = config["replacement"]
    elif stage.kind == "template":
        wire["template"], wire["system"] = config["template"], config["system"]
    elif stage.kind == "retrieve":
        wire["index"], wire["top_k"], wire["revision"] = config["index"], config["top_k"], plan.revision
    return wire
