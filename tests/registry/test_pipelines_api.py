"""Pipelines through the API as tenants and CI use them: define, version, promote; every refusal names
the stage and writes nothing; one tenant's pipelines are invisible to another."""

import copy
import json
from typing import Any

import pytest

from core.models import AuditEvent
from registry.models import Pipeline, PipelineVersion
from registry.services.models import model_register
from tests.support.principals import principal
from tests.support.registry import advance, register

A = "/api/v1/pipelines/acme/support-rag"


@pytest.fixture
def models(world, chat_model):
    """Tenant A's chat and embedding models and the platform's catalog reranker, each in production;
    tenant B's private chat model."""
    alice, ops = principal(world.alice), principal(world.operator)
    advance(register(chat_model, alice), alice, "production")
    minilm = model_register(actor=alice, owner=world.tenant_a, name="minilm", task="embedding")
    advance(register(minilm, alice), alice, "production")
    reranker = model_register(
        actor=ops, owner=None, name="bge-reranker", task="reranking", visibility="catalog"
    )
    advance(register(reranker, ops), ops, "production")
    globex = model_register(actor=principal(world.bob), owner=world.tenant_b, name="secret-bot", task="chat")
    advance(
        register(globex, principal(world.bob), allowed_jurisdictions=["US"]),
        principal(world.bob),
        "production",
    )


def graph(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "stages": [
            {"name": "clean", "kind": "redact", "input": "request.query", "patterns": ["email"]},
            {"name": "embed", "kind": "model", "task": "embed", "model": "acme/minilm", "input": "clean"},
            {"name": "search", "kind": "retrieve", "index": "handbook", "input": "embed"},
            {
                "name": "rerank",
                "kind": "model",
                "task": "rerank",
                "model": "platform/bge-reranker",
                "input": {"query": "clean", "documents": "search"},
                "on_failure": "skip",
                "timeout_ms": 300,
            },
            {
                "name": "prompt",
                "kind": "template",
                "template": "Context:\n{docs}\n\nQuestion: {question}",
                "input": {"docs": "rerank", "question": "clean"},
            },
            {
                "name": "answer",
                "kind": "model",
                "task": "chat",
                "model": "acme/llama-3-8b",
                "input": "prompt",
            },
        ],
        "output": "answer",
        "budget_ms": 8000,
    }
    for name, fields in changes.items():  # a field set to None is removed
        stage = next(s for s in raw["stages"] if s["name"] == name)
        stage.update(fields)
        for field in [f for f, value in fields.items() if value is None]:
            del stage[field]
    return copy.deepcopy(raw)


def define(client, version: str = "1.0.0", **changes: Any):  # type: ignore[no-untyped-def]
    return client.post(A + "/versions/", {"version": version, "graph": graph(**changes)}, format="json")


@pytest.fixture
def pipeline(world, api, models):
    created = api(world.alice).post(
        "/api/v1/pipelines/",
        {"owner": "acme", "name": "support-rag", "description": "Handbook answers"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    return created.json()


def test_a_tenant_defines_versions_and_promotes_a_pipeline(world, api, pipeline):
    alice = api(world.alice)
    assert pipeline["ref"] == "acme/support-rag"
    first = define(alice)
    assert first.status_code == 201, first.json()
    assert (first.json()["status"], first.json()["graph"]["output"]) == ("draft", "answer")
    # A draft's graph may change; out of draft it is immutable.
    tighter = {"graph": graph(search={"top_k": 2})}
    assert alice.patch(A + "/versions/1.0.0/", tighter, format="json").status_code == 200
    promoted = alice.post(A + "/versions/1.0.0/transitions/", {"to": "production"}, format="json")
    assert promoted.json()["status"] == "production", promoted.json()
    frozen = alice.patch(A + "/versions/1.0.0/", {"graph": graph()}, format="json")
    assert (frozen.status_code, frozen.json()["error"]["code"]) == (409, "immutable")
    # A second version into production deprecates the first, in one transaction.
    assert define(alice, "1.1.0", answer={"max_tokens": 256}).status_code == 201
    assert (
        alice.post(A + "/versions/1.1.0/transitions/", {"to": "production"}, format="json").status_code == 200
    )
    assert alice.get(A + "/").json()["versions"] == {"1.1.0": "production", "1.0.0": "deprecated"}
    wrong = alice.post(A + "/versions/1.0.0/transitions/", {"to": "draft"}, format="json")
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (409, "invalid_transition")
    back = alice.post(A + "/versions/1.1.0/transitions/", {"to": "retired"}, format="json")
    assert (back.status_code, back.json()["error"]["code"]) == (409, "invalid_transition")
    actions = list(
        AuditEvent.objects.filter(action__startswith="pipeline.")
        .order_by("pk")
        .values_list("action", flat=True)
    )
    assert actions == [
        "pipeline.created",
        "pipeline.version_created",
        "pipeline.version_updated",
        "pipeline.version_transitioned",
        "pipeline.version_created",
        "pipeline.version_transitioned",  # 1.0.0 deprecated
        "pipeline.version_transitioned",  # 1.1.0 to production
    ]


BAD = [
    # (stage changes, the detail key, words of the message)
    ({"embed": {"model": "acme/nothing"}}, "stages.embed.model", "no model acme/nothing"),
    ({"answer": {"model": "globex/secret-bot"}}, "stages.answer.model", "no model globex/secret-bot"),
    ({"embed": {"model": "acme/llama-3-8b"}}, "stages.embed.task", "is a chat model"),
    ({"rerank": {"model": "acme/llama-3-8b"}}, "stages.rerank.task", "is a chat model"),
    ({"answer": {"version": "9.9.9"}}, "stages.answer.version", "has no version 9.9.9"),
    ({"answer": {"alias": "canary"}}, "stages.answer.alias", "points at no version"),
    (
        {
            "search": {
                "kind": "http",
                "url": "https://search.example.com",
                "jurisdiction": "US",
                "output": "documents",
                "index": None,
            }
        },
        "stages.search.jurisdiction",
        "US is outside acme's residency policy (CH, EU)",
    ),
    ({"search": {"top_k": "many"}}, "stages.search.top_k", "whole number"),
]


@pytest.mark.parametrize(("changes", "where", "words"), BAD, ids=[b[1] for b in BAD])
def test_a_bad_version_is_refused_naming_the_stage_and_nothing_is_written(
    world, api, pipeline, changes, where, words
):
    alice = api(world.alice)  # minting its token is audited
    written = (PipelineVersion.objects.count(), AuditEvent.objects.count())
    stages = graph(**changes)
    refused = alice.post(A + "/versions/", {"version": "2.0.0", "graph": stages}, format="json")
    assert refused.status_code == 400, refused.json()
    error = refused.json()["error"]
    assert list(error["detail"]) == [where] and words in error["message"], error
    assert (PipelineVersion.objects.count(), AuditEvent.objects.count()) == written


def test_an_embedding_model_may_rerank_by_the_cosine_of_its_embeddings(world, api, pipeline):
    defined = define(api(world.alice), rerank={"model": "acme/minilm", "top_n": 2})
    assert defined.status_code == 201, defined.json()
    (rerank,) = [s for s in defined.json()["graph"]["stages"] if s["name"] == "rerank"]
    assert (rerank["model"], rerank["top_n"]) == ("acme/minilm", 2)


def test_a_version_whose_weights_may_not_serve_the_owner_is_refused(world, api, models):
    """globex (US) may not build on a model whose weights are allowed only in the EU."""
    bob = api(world.bob)
    assert (
        bob.post("/api/v1/pipelines/", {"owner": "globex", "name": "eu-rag"}, format="json").status_code
        == 201
    )
    eu_only = {
        "stages": [
            {
                "name": "answer",
                "kind": "model",
                "task": "rerank",
                "model": "platform/bge-reranker",
                "input": {"query": "request.query", "documents": "docs"},
            },
            {"name": "docs", "kind": "retrieve", "index": "kb", "input": "vec"},
            {
                "name": "vec",
                "kind": "http",
                "url": "https://e.example",
                "jurisdiction": "US",
                "output": "vector",
                "input": "request.query",
            },
            {"name": "say", "kind": "template", "template": "{d}", "input": {"d": "answer"}},
            {"name": "out", "kind": "model", "task": "chat", "model": "globex/secret-bot", "input": "say"},
        ],
        "output": "out",
        "budget_ms": 1000,
    }
    refused = bob.post(
        "/api/v1/pipelines/globex/eu-rag/versions/", {"version": "1", "graph": eu_only}, format="json"
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["detail"] == {
        "stages.answer.model": [
            "platform/bge-reranker@1.0.0 may be served only in CH, EU, none of it in globex's residency (US)"
        ]
    }


@pytest.mark.parametrize(
    "body",
    [
        {"version": "1.0.0"},
        {"version": "1.0.0", "graph": "x" * 10},
        {"version": "bad version", "graph": graph()},
        {"version": "1\x00", "graph": graph()},
        {"version": "1.0.0", "graph": graph(), "status": "production"},
        [1, 2],
    ],
)
def test_hostile_bodies_are_refused_with_the_envelope(world, api, pipeline, body):
    refused = api(world.alice).post(A + "/versions/", body, format="json")
    assert refused.status_code == 400 and "error" in refused.json()
    assert PipelineVersion.objects.count() == 0


def test_deeply_nested_and_nul_graphs_are_refused(world, api, pipeline):
    nested: Any = {}
    for _ in range(200):
        nested = {"a": nested}
    deep = api(world.alice).post(
        A + "/versions/", {"version": "1", "graph": {"stages": nested}}, format="json"
    )
    assert deep.status_code == 400
    nul = graph()
    nul["stages"][0]["name"] = "cl\x00ean"
    refused = api(world.alice).post(A + "/versions/", {"version": "1", "graph": nul}, format="json")
    assert refused.status_code == 400
    assert "graph.stages[0].name" in refused.json()["error"]["message"]  # where the NUL is
    assert PipelineVersion.objects.count() == 0


def test_another_tenant_sees_and_touches_nothing_of_a_private_pipeline(world, api, pipeline):
    assert define(api(world.alice)).status_code == 201
    bob = api(world.bob)
    assert "support-rag" not in str(bob.get("/api/v1/pipelines/").json())
    for path in ["/", "/versions/", "/versions/1.0.0/"]:
        assert bob.get(A + path).status_code == 404, path
    assert define(bob, "2.0.0").status_code == 404
    assert bob.patch(A + "/versions/1.0.0/", {"graph": graph()}, format="json").status_code == 404
    assert (
        bob.post(A + "/versions/1.0.0/transitions/", {"to": "production"}, format="json").status_code == 404
    )
    taken = bob.post("/api/v1/pipelines/", {"owner": "acme", "name": "mine"}, format="json")
    assert taken.status_code in (403, 404)
    assert not Pipeline.objects.filter(name="mine").exists()
    assert PipelineVersion.objects.get().status == "draft"


def test_a_viewer_reads_but_does_not_write_and_the_platform_catalog_is_read_only_to_tenants(
    world, api, pipeline
):
    vera = api(world.vera)
    assert vera.get(A + "/").status_code == 200
    assert define(vera).status_code == 403
    ops = api(world.operator)
    assert (
        ops.post("/api/v1/pipelines/", {"owner": "platform", "name": "faq"}, format="json").status_code == 201
    )
    for tenant in (world.alice, world.bob):
        assert api(tenant).get("/api/v1/pipelines/platform/faq/").status_code == 200
        body = {"version": "1", "graph": graph()}
        assert (
            api(tenant).post("/api/v1/pipelines/platform/faq/versions/", body, format="json").status_code
            == 403
        )


def test_a_stage_sending_a_secret_is_the_tenants_own_over_https_by_whoever_manages_its_secrets(
    world, api, pipeline
):
    keyed = {
        "search": {
            "kind": "http",
            "url": "https://search.acme.example/",
            "jurisdiction": "EU",
            "output": "documents",
            "secret": "search-key",
            "index": None,
        }
    }
    written = (PipelineVersion.objects.count(), AuditEvent.objects.count())
    # A CI token that may write and promote pipelines, but not manage secrets, cannot send one anywhere.
    ci = api(world.alice, scopes=["registry:read", "registry:write", "registry:promote"])
    refused = define(ci, "2.0.0", **keyed)
    assert refused.status_code == 403 and refused.json()["error"]["detail"]["scope"] == "secrets:write"
    plain = {"search": {**keyed["search"], "url": "http://search.acme.example/"}}
    cleartext = define(api(world.alice), "2.0.0", **plain)
    assert cleartext.status_code == 400
    assert cleartext.json()["error"]["detail"] == {
        "stages.search.url": ["a stage that sends a secret calls an https URL only"]
    }
    assert (PipelineVersion.objects.count(), AuditEvent.objects.count()) == (
        written[0],
        written[1] + 2,
    )  # tokens
    assert define(api(world.alice), "2.0.0", **keyed).status_code == 201
    ops = api(world.operator)
    ops.post("/api/v1/pipelines/", {"owner": "platform", "name": "catalog-rag"}, format="json")
    catalog = ops.post(
        "/api/v1/pipelines/platform/catalog-rag/versions/",
        {"version": "1", "graph": graph(**keyed)},
        format="json",
    )
    assert catalog.status_code == 400
    assert catalog.json()["error"]["detail"] == {
        "stages.search.secret": ["a platform pipeline cannot send tenants' secrets"]
    }


def test_a_lone_surrogate_anywhere_in_a_graph_is_a_400_naming_the_stage_not_a_500(world, api, pipeline):
    alice = api(world.alice)
    written = PipelineVersion.objects.count()
    body = json.dumps({"version": "3.0.0", "graph": graph(prompt={"template": "{docs} {question} \ud800"})})
    refused = alice.post(
        A + "/versions/", body.encode("utf-8", "surrogatepass"), content_type="application/json"
    )
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["detail"] == {
        "stages.prompt": ["text must be valid Unicode (a lone surrogate is not)"]
    }
    assert PipelineVersion.objects.count() == written
