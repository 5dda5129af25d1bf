"""The pipeline pages: each stage's deployment, regions and why it cannot run, for the owner tenant (a
platform pipeline: for the tenant picked); promotion from the page; another tenant sees nothing."""

import json
import re
from html import unescape

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from core.models import AuditEvent, Tenant
from regions.services.deployments import deployment_create
from registry.services.models import model_register
from registry.services.pipelines import pipeline_create, pipeline_version_create, pipeline_version_transition
from routing.pipelines import attach_pipelines, pipeline_plan
from routing.services import publish
from tests.support.factories import TenantFactory
from tests.support.gateway import gateway_secret
from tests.support.principals import principal
from tests.support.regions import tiny_version, until_ready
from tests.support.registry import advance, register

PAGE = "/routing/pipelines/acme/support/"


def _graph(http_jurisdiction: str = "EU") -> dict:
    return {
        "stages": [
            {
                "name": "facts",
                "kind": "http",
                "url": "https://facts.example.com/lookup",
                "jurisdiction": http_jurisdiction,
                "output": "text",
                "input": "request.query",
            },
            {"name": "prompt", "kind": "template", "template": "Facts: {facts}", "input": {"facts": "facts"}},
            {
                "name": "answer",
                "kind": "model",
                "task": "chat",
                "model": "acme/tiny-llama",
                "input": "prompt",
            },
        ],
        "output": "answer",
        "budget_ms": 5000,
    }


@pytest.fixture
def tiny(world, tiny_model_dir):
    return tiny_version(principal(world.alice), tiny_model_dir, owner=world.tenant_a)


@pytest.fixture
def support(world, tiny):
    alice = principal(world.alice)
    pipeline = pipeline_create(actor=alice, owner=world.tenant_a, name="support")
    pipeline_version_create(actor=alice, pipeline=pipeline, version="1.0.0", graph=_graph())
    return pipeline


def _stage_row(html: str, stage: str) -> str:
    found = re.search(rf'<tr data-stage="{stage}">(.*?)</tr>', html, re.S)
    assert found, stage
    return unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", found.group(1))).strip())


def test_the_page_shows_where_each_stage_runs_and_what_is_missing(world, client, support, tiny, make_region):
    client.force_login(world.alice)
    html = client.get(PAGE).content.decode()
    assert "Not servable now" in html
    assert _stage_row(html, "answer").endswith("no deployment of acme/tiny-llama@1.0.0 serves acme")
    assert "https://facts.example.com/lookup (EU)" in _stage_row(html, "facts")
    assert _stage_row(html, "prompt") == "prompt template the gateway — —"
    make_region("eu-west-1", "EU")  # a simulator engine, really started
    chat = deployment_create(
        actor=principal(world.alice), owner=world.tenant_a, name="chat", model=tiny.model, version="1.0.0"
    )
    until_ready(chat)
    publish()
    html = client.get(PAGE).content.decode()
    assert _stage_row(html, "answer") == "answer model deployment chat (acme/tiny-llama@1.0.0) eu-west-1 —"
    assert "Every stage can run inside acme's residency now." in html


def test_a_platform_pipeline_is_planned_for_the_tenant_picked(world, client):
    ops = principal(world.operator)
    platform = pipeline_create(actor=ops, owner=None, name="faq")
    graph = _graph("US")
    graph["stages"][2] = {
        "name": "answer",
        "kind": "model",
        "task": "chat",
        "model": "platform/qwen",
        "input": "prompt",
    }
    qwen = model_register(actor=ops, owner=None, name="qwen", task="chat", visibility="catalog")
    advance(register(qwen, ops, allowed_jurisdictions=["EU", "US"]), ops, "production")
    pipeline_version_create(actor=ops, pipeline=platform, version="1", graph=graph)
    client.force_login(world.operator)
    acme = client.get("/routing/pipelines/platform/faq/?tenant=acme").content.decode()
    assert "US is outside acme's residency policy (CH, EU)" in _stage_row(acme, "facts")
    globex = client.get("/routing/pipelines/platform/faq/?tenant=globex").content.decode()
    assert _stage_row(globex, "facts") == "facts http https://facts.example.com/lookup (US) — —"
    client.force_login(world.bob)  # a tenant sees the catalog's pipeline, planned for itself only
    mine = client.get("/routing/pipelines/platform/faq/?tenant=acme").content.decode()
    assert "for globex" in mine and "outside acme" not in mine


def test_promoting_from_the_page_and_another_tenant_sees_nothing(world, client, support):
    client.force_login(world.bob)
    assert "support" not in client.get("/routing/pipelines/").content.decode()
    assert client.get(PAGE).status_code == 404
    move = {"version": "1.0.0", "to": "production", "reason": "go"}
    assert client.post(PAGE + "transition/", move).status_code == 404
    client.force_login(world.vera)  # acme's viewer: may look, not promote
    page = client.get(PAGE).content.decode()
    assert "support" in page and 'id="transition-form"' not in page
    assert client.post(PAGE + "transition/", move).status_code == 403
    client.force_login(world.alice)
    done = client.post(PAGE + "transition/", move, follow=True).content.decode()
    assert "acme/support@1.0.0 is now production." in done
    bad = client.post(PAGE + "transition/", {**move, "to": "everywhere"}, follow=True).content.decode()
    assert "Choose a version and the status to move it to." in bad
    assert AuditEvent.objects.filter(action="pipeline.version_transitioned").count() == 1


def _view(slug: str) -> dict:
    return publish().body["tenants"][slug]


def test_the_route_table_carries_production_pipelines_resolved_for_each_tenant(
    world, support, tiny, make_region
):
    alice, ops = principal(world.alice), principal(world.operator)
    assert "pipelines" not in _view("acme")  # a draft is not served
    pipeline_version_transition(actor=alice, version=support.versions.get(), to="production")
    assert _view("acme")["pipelines"]["support"] == {
        "version": "acme/support@1.0.0",
        "budget_ms": 5000,
        "output": ["answer"],
        "stages": [],
        "unavailable": "stage answer: no deployment of acme/tiny-llama@1.0.0 serves acme",
        "regions": [],  # no region yet where acme's data may be processed
    }
    make_region("eu-west-1", "EU")
    until_ready(
        deployment_create(actor=alice, owner=world.tenant_a, name="chat", model=tiny.model, version="1.0.0")
    )
    served = _view("acme")["pipelines"]["support"]
    assert "unavailable" not in served
    assert [(s["name"], s.get("route")) for s in served["stages"]] == [
        ("facts", None),
        ("prompt", None),
        ("answer", "chat"),
    ]
    assert served["stages"][0]["jurisdiction"] == "EU" and served["stages"][1]["template"] == "Facts: {facts}"
    assert "pipelines" not in _view("globex")  # acme's pipeline is acme's alone

    lookup = pipeline_create(actor=ops, owner=None, name="lookup")
    only_http = {"stages": [_graph("US")["stages"][0]], "output": "facts", "budget_ms": 1000}
    pipeline_version_transition(
        actor=ops,
        version=pipeline_version_create(actor=ops, pipeline=lookup, version="1", graph=only_http),
        to="production",
    )
    assert _view("acme")["pipelines"]["lookup"]["unavailable"] == (
        "stage facts: US is outside acme's residency policy (CH, EU)"
    )
    assert _view("globex")["pipelines"]["lookup"]["stages"][0]["url"] == "https://facts.example.com/lookup"
    # A model name the tenant already calls stays the model's.
    named = pipeline_create(actor=ops, owner=None, name="chat")
    pipeline_version_transition(
        actor=ops,
        version=pipeline_version_create(actor=ops, pipeline=named, version="1", graph=only_http),
        to="production",
    )
    assert "chat" not in _view("acme")["pipelines"] and "chat" in _view("globex")["pipelines"]


def test_a_retrieve_stage_searches_the_calling_tenants_own_index(world, api):
    ops = principal(world.operator)
    faq = pipeline_create(actor=ops, owner=None, name="faq")
    graph = {
        "stages": [
            {
                "name": "vec",
                "kind": "http",
                "url": "https://e.example",
                "jurisdiction": "EU",
                "output": "vector",
                "input": "request.query",
            },
            {"name": "search", "kind": "retrieve", "index": "handbook", "top_k": 2, "input": "vec"},
            {
                "name": "say",
                "kind": "http",
                "url": "https://s.example",
                "jurisdiction": "EU",
                "output": "text",
                "input": "search",
            },
        ],
        "output": "say",
        "budget_ms": 2000,
    }
    version = pipeline_version_create(actor=ops, pipeline=faq, version="1", graph=graph)
    pipeline_version_transition(actor=ops, version=version, to="production")
    assert _view("acme")["pipelines"]["faq"]["unavailable"] == "stage search: acme has no index handbook"
    alice = api(world.alice)
    alice.post("/api/v1/indexes/", {"owner": "acme", "name": "handbook", "dimensions": 2}, format="json")
    alice.put(
        "/api/v1/indexes/acme/handbook/documents/",
        {"documents": [{"key": "a", "text": "A", "vector": [1, 0]}]},
        format="json",
    )
    search = _view("acme")["pipelines"]["faq"]["stages"][1]
    assert (search["index"], search["top_k"], search["revision"]) == ("handbook", 2, 1)
    plan = {p.stage: p.refusal for p in pipeline_plan(world.tenant_b, version, publish().body)}
    assert plan["search"] == "globex has no index handbook"  # acme's documents are acme's alone
    assert plan["vec"] == "EU is outside globex's residency policy (US)"


def _secret_lookup(world) -> None:  # type: ignore[no-untyped-def]
    """acme's pipeline "lookup": one http stage sending acme's secret search-key, in production."""
    alice = principal(world.alice)
    lookup = pipeline_create(actor=alice, owner=world.tenant_a, name="lookup")
    stage = {**_graph()["stages"][0], "secret": "search-key"}
    graph = {"stages": [stage], "output": "facts", "budget_ms": 1000}
    version = pipeline_version_create(actor=alice, pipeline=lookup, version="1", graph=graph)
    pipeline_version_transition(actor=alice, version=version, to="production")


def test_an_http_stage_sends_the_tenants_secret_whose_value_only_gateways_get(world, api):
    _secret_lookup(world)
    assert _view("acme")["pipelines"]["lookup"]["unavailable"] == "stage facts: acme has no secret search-key"
    alice = api(world.alice)
    alice.put("/api/v1/tenants/acme/secrets/search-key/", {"value": "acme-search-token"}, format="json")
    wire = _view("acme")["pipelines"]["lookup"]["stages"][0]
    first = wire["secret_version"]
    assert wire["secret"] == "search-key" and first.endswith(".1") and "secret_value" not in wire
    assert "acme-search-token" not in json.dumps(publish().body)  # the stored, shown table has no value
    assert "acme-search-token" not in alice.get("/api/v1/routing/table/").content.decode()
    gateway = api(secret=gateway_secret(world))
    config = gateway.get("/api/v1/routing/gateway-config/").json()["table"]["tenants"]
    assert config["acme"]["pipelines"]["lookup"]["stages"][0]["secret_value"] == "acme-search-token"
    assert "lookup" not in config["globex"].get("pipelines", {})  # acme's alone
    alice.put("/api/v1/tenants/acme/secrets/search-key/", {"value": "acme-rotated"}, format="json")
    rotated = _view("acme")["pipelines"]["lookup"]["stages"][0]["secret_version"]
    assert rotated.endswith(".2")  # a new table
    # Deleted and stored again: revision 1 again, but never the same version (gateways see a new table).
    alice.delete("/api/v1/tenants/acme/secrets/search-key/")
    alice.put("/api/v1/tenants/acme/secrets/search-key/", {"value": "acme-again"}, format="json")
    again = _view("acme")["pipelines"]["lookup"]["stages"][0]["secret_version"]
    assert again.endswith(".1") and again not in (first, rotated)
    config = gateway.get("/api/v1/routing/gateway-config/").json()["table"]["tenants"]
    assert config["acme"]["pipelines"]["lookup"]["stages"][0]["secret_value"] == "acme-again"
    # The global entry runs no pipeline: it gets no tenant's secret.
    entry = gateway.get("/api/v1/routing/gateway-config/?secrets=none").json()["table"]["tenants"]
    assert "secret_value" not in entry["acme"]["pipelines"]["lookup"]["stages"][0]


def test_a_gateway_outside_a_tenants_residency_gets_neither_its_secrets_nor_its_index(
    world, api, make_region
):
    make_region("eu-west-1", "EU")
    make_region("us-east-1", "US")
    _secret_lookup(world)
    alice = api(world.alice)
    alice.put("/api/v1/tenants/acme/secrets/search-key/", {"value": "acme-search-token"}, format="json")
    alice.post("/api/v1/indexes/", {"owner": "acme", "name": "handbook", "dimensions": 2}, format="json")
    assert _view("acme")["pipelines"]["lookup"]["regions"] == ["eu-west-1"]  # where acme's data may be
    gateway = api(secret=gateway_secret(world))

    def config(regions: str) -> dict:
        url = f"/api/v1/routing/gateway-config/?regions={regions}"
        return gateway.get(url).json()["table"]["tenants"]["acme"]["pipelines"]["lookup"]["stages"][0]

    assert config("eu-west-1")["secret_value"] == "acme-search-token"
    assert "secret_value" not in config("us-east-1") and "secret_value" not in config("eu-west-1,us-east-1")
    index = "/api/v1/routing/indexes/acme/handbook/"
    assert gateway.get(index + "?regions=eu-west-1").status_code == 200
    refused = gateway.get(index + "?regions=us-east-1")
    assert refused.status_code == 403
    assert "acme's data may not be processed in us-east-1" in refused.json()["error"]["message"]
    assert "secret_value" not in config("nowhere")  # a region no longer known holds nobody's data
    # A gateway whose account is bound to us-east-1 gets none of acme's, whatever it declares (or not).
    bound = api(secret=gateway_secret(world, regions=["us-east-1"]))
    for asked in ("/api/v1/routing/gateway-config/", "/api/v1/routing/gateway-config/?regions=eu-west-1"):
        stage = bound.get(asked).json()["table"]["tenants"]["acme"]["pipelines"]["lookup"]["stages"][0]
        assert "secret_value" not in stage
    assert bound.get(index).status_code == 403 and bound.get(index + "?regions=eu-west-1").status_code == 403
    assert gateway.get(index + "?regions=nowhere").status_code == 403
    for bad, words in (
        ("Not A Region!", "regions must list"),
        (",".join(f"r{n}" for n in range(70)), "regions must list"),
        ("eu-west-1,\x00", "NUL characters are not allowed"),
    ):
        answer = gateway.get(index, {"regions": bad})
        assert answer.status_code == 400 and words in answer.json()["error"]["message"]


def test_resolving_pipelines_reads_the_database_a_fixed_number_of_times_whatever_the_tenants(world, tiny):
    """A catalog pipeline used by every tenant: its stages are resolved from facts read once per publish."""
    ops = principal(world.operator)
    catalog = model_register(actor=ops, owner=None, name="embed", task="embedding", visibility="catalog")
    advance(register(catalog, ops), ops, "production")
    faq = pipeline_create(actor=ops, owner=None, name="faq")
    graph = {
        "stages": [
            {
                "name": "vec",
                "kind": "model",
                "task": "embed",
                "model": "platform/embed",
                "input": "request.query",
            },
            {"name": "search", "kind": "retrieve", "index": "handbook", "input": "vec"},
            {**_graph()["stages"][0], "input": "search"},
        ],
        "output": "facts",
        "budget_ms": 2000,
    }
    version = pipeline_version_create(actor=ops, pipeline=faq, version="1", graph=graph)
    pipeline_version_transition(actor=ops, version=version, to="production")

    def queries(count: int) -> int:
        for n in range(count):
            TenantFactory(slug=f"t{count}-{n}", residency=["EU"])
        slugs = list(Tenant.objects.values_list("slug", flat=True))
        views = {slug: {"limits": {}, "blocked": "", "models": {}} for slug in slugs}
        with CaptureQueriesContext(connection) as done:
            attach_pipelines(views)  # type: ignore[arg-type]
        assert all("faq" in view["pipelines"] for view in views.values())
        return len(done.captured_queries)

    assert queries(1) == queries(30)
