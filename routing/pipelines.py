"""Where each stage of a pipeline runs for one tenant, now: the deployment (and its regions) serving a
model stage, the jurisdiction of an ``http`` stage, the gateway for built-ins; and why a stage cannot run
inside the tenant's residency. Read by the pipeline page; the same rule as the definition's check
(``core.residency``), applied to the tenant calling."""

from dataclasses import dataclass

from django.db.models import Q

from core.models import Tenant
from core.residency import processing_refusal, residency_of
from gateway import contract
from regions.choices import DeploymentState
from regions.models import Deployment
from registry import selectors as registry_selectors
from registry.models import PipelineVersion
from registry.pipelines import Graph, Stage, parse_graph

BUILT_IN = {"redact", "template"}


@dataclass(frozen=True)
class StagePlan:
    stage: str
    kind: str
    serves: str  # what runs it: a deployment, a service and its jurisdiction, the gateway
    regions: tuple[str, ...] = ()  # a model stage's regions with an engine up, in the route's order
    refusal: str = ""  # why it cannot run for this tenant now ('' when it can)


def pipeline_plan(tenant: Tenant, version: PipelineVersion, table: contract.RouteTable) -> list[StagePlan]:
    graph: Graph = parse_graph(version.graph)
    view = table.get("tenants", {}).get(tenant.slug)
    routes = view["models"] if view else {}
    return [_plan(tenant, stage, routes) for stage in graph.stages.values()]


def _plan(tenant: Tenant, stage: Stage, routes: dict[str, contract.Route]) -> StagePlan:
    if stage.kind == "model":
        return _model_plan(tenant, stage, routes)
    if stage.kind == "http":
        jurisdiction = stage.config["jurisdiction"]
        refusal = processing_refusal(residency_of(tenant), jurisdiction) or ""
        return StagePlan(stage.name, stage.kind, f"{stage.config['url']} ({jurisdiction})", refusal=refusal)
    if stage.kind == "retrieve":
        return StagePlan(
            stage.name,
            stage.kind,
            f"index {stage.config['index']}",
            refusal="retrieval indexes are not available yet",
        )
    return StagePlan(stage.name, stage.kind, "the gateway")


def _model_plan(tenant: Tenant, stage: Stage, routes: dict[str, contract.Route]) -> StagePlan:
    version = registry_selectors.stage_version(stage.config)
    if version is None:
        return StagePlan(stage.name, stage.kind, stage.config["model"], refusal="no version to run")
    deployments = Deployment.objects.filter(
        Q(owner=tenant) | Q(shared=True), state=DeploymentState.ACTIVE, version=version
    ).order_by("-owner_id", "name")  # the tenant's own first
    for deployment in deployments:
        route = routes.get(deployment.name)
        if route is None:
            continue
        regions = tuple(dict.fromkeys(e["region"] for e in route["endpoints"]))
        refusal = "" if regions else route.get("unavailable", "no engine is up")
        return StagePlan(
            stage.name, stage.kind, f"deployment {deployment.name} ({version})", regions, refusal
        )
    return StagePlan(
        stage.name, stage.kind, str(version), refusal=f"no deployment of {version} serves {tenant.slug}"
    )
