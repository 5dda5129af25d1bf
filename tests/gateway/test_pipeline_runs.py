"""Pipelines run by the gateway (in-process, a fake engine, real local HTTP services as the tenant's
stages): stages in order, side by side where they can be, conditional routes, redaction before anything
leaves, timeouts and the budget with their policies, and the answer streamed by its model."""

import socket
import threading
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiohttp.abc import AbstractResolver

from gateway.addresses import Addresses
from gateway.pipeline_requests import every_answer_runs_a_model
from regions.engines.simulator import Engine, Handler
from tests.support.gateway_harness import GatewayWorld, Service, endpoint


def http(
    name: str, service: Service, source: str | dict[str, str], output: str = "text", **more: Any
) -> dict:
    inputs = source if isinstance(source, dict) else {"input": source}
    stage = {"name": name, "kind": "http", "inputs": inputs, "output": output, "timeout_ms": None}
    return {**stage, "on_failure": "fail", "url": service.url, "jurisdiction": "EU", **more}


def pipeline(*stages: dict, output: list[str] | None = None, budget_ms: int = 5000) -> dict:
    return {
        "version": "acme/support@1.0.0",
        "budget_ms": budget_ms,
        "output": output or [stages[-1]["name"]],
        "stages": list(stages),
    }


REDACT = {
    "name": "clean",
    "kind": "redact",
    "inputs": {"text": "request.query"},
    "output": "text",
    "timeout_ms": None,
    "on_failure": "fail",
    "patterns": [r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}"],
    "replacement": "[email]",
}
PROMPT = {
    "name": "prompt",
    "kind": "template",
    "inputs": {"facts": "facts", "question": "clean"},
    "output": "messages",
    "timeout_ms": None,
    "on_failure": "fail",
    "template": "Facts: {facts}\nQuestion: {question}",
    "system": "Answer from the facts.",
}
ANSWER = {
    "name": "answer",
    "kind": "model",
    "inputs": {"messages": "prompt"},
    "output": "text",
    "timeout_ms": None,
    "on_failure": "fail",
    "route": "chat",
    "task": "chat",
}


@pytest.fixture
def services():
    started: list[Service] = []

    def start(*args: Any, **kwargs: Any) -> Service:
        started.append(Service(*args, **kwargs))
        return started[-1]

    yield start
    for service in started:
        service.close()


def offer(gw, name: str, route: dict) -> None:  # type: ignore[no-untyped-def]
    gw.gateway.routes.body["tenants"]["acme"]["pipelines"] = {name: route}


def ask(gw, question: str = "My mail is ann@example.com: what is the refund window?", **extra: Any):  # type: ignore[no-untyped-def]
    return gw.chat(model="support", messages=[{"role": "user", "content": question}], **extra)


def test_a_rag_pipeline_redacts_fetches_fills_the_prompt_and_streams_the_answer(gw, services):
    facts = services(lambda inputs: f"refunds within 30 days ({inputs['input']})")
    offer(gw, "support", pipeline(REDACT, http("facts", facts, "clean"), PROMPT, ANSWER))
    answer = ask(gw, stream=True)
    assert answer.status == 200 and answer.headers["content-type"].startswith("text/event-stream")
    assert answer.body.endswith(b"data: [DONE]\n\n")
    assert facts.got == [{"input": "My mail is [email]: what is the refund window?"}]  # no address left
    sent = gw.engine.seen[-1]["body"]
    assert sent["stream"] is True and sent["messages"] == [
        {"role": "system", "content": "Answer from the facts."},
        {
            "role": "user",
            "content": "Facts: refunds within 30 days (My mail is [email]: what is the refund window?)\n"
            "Question: My mail is [email]: what is the refund window?",
        },
    ]
    assert gw.ship() == 1  # the model stage is metered as the request it is (the http stage: no engine)
    (record,) = gw.control.records
    assert (record["model_name"], record["pipeline"], record["stage"]) == (
        "chat",
        "acme/support@1.0.0",
        "answer",
    )
    metrics = gw.call("GET", "/metrics", tenant=None).body.decode()
    for stage in ("clean", "facts", "prompt", "answer"):
        labels = f'outcome="ok",pipeline="support",stage="{stage}",tenant="acme"'
        assert f"gateway_pipeline_stage_duration_seconds_count{{{labels}}} 1.0" in metrics
    staged = 'pipeline_version="acme/support@1.0.0",stage="answer",tenant="acme"'
    assert f'gateway_pipeline_stage_tokens_total{{kind="prompt",{staged}}} 5.0' in metrics
    assert f'gateway_pipeline_stage_tokens_total{{kind="completion",{staged}}} 2.0' in metrics


def test_stages_that_wait_for_nothing_run_side_by_side(gw, services):
    both = threading.Barrier(2, timeout=5)  # each service answers only while the other is asked too
    faq, manual = services(lambda i: "faq", barrier=both), services(lambda i: "manual", barrier=both)
    prompt = {**PROMPT, "inputs": {"facts": "faq", "question": "manual"}}
    offer(
        gw,
        "support",
        pipeline(http("faq", faq, "request.query"), http("manual", manual, "request.query"), prompt, ANSWER),
    )
    assert ask(gw).status == 200
    assert gw.engine.seen[-1]["body"]["messages"][-1]["content"] == "Facts: faq\nQuestion: manual"


def test_a_label_chooses_the_answering_stage(gw, services):
    router = services(lambda i: "billing" if "refund" in i["input"] else "other")
    billing, general = services(lambda i: "billing team answer"), services(lambda i: "general answer")
    route = pipeline(
        http("topic", router, "request.query", output="label"),
        http(
            "billing",
            billing,
            "request.query",
            when={"stage": "topic", "labels": ["billing"], "otherwise": False},
        ),
        http("general", general, "request.query", when={"stage": "topic", "labels": [], "otherwise": True}),
        output=["billing", "general"],
    )
    offer(gw, "support", route)
    first = ask(gw)
    assert first.status == 200 and first.json()["choices"][0]["message"]["content"] == "billing team answer"
    second = ask(gw, question="hello")
    assert second.json()["choices"][0]["message"]["content"] == "general answer"
    assert (len(billing.got), len(general.got)) == (1, 1)
    streamed = ask(gw, question="hello", stream=True)
    assert streamed.body.startswith(b"data: ") and streamed.body.endswith(b"data: [DONE]\n\n")


def test_a_stage_that_overruns_fails_the_request_or_is_skipped_by_policy(gw, services):
    slow = services(lambda i: "late facts", delay=1.0)
    stages = [REDACT, http("facts", slow, "clean", timeout_ms=200), PROMPT, ANSWER]
    offer(gw, "support", pipeline(*stages))
    failed = ask(gw)
    assert failed.status == 504 and failed.json()["error"]["code"] == "pipeline_timeout"
    assert "support: stage facts failed: it took longer than 200 ms" in failed.json()["error"]["message"]
    assert gw.engine.seen == []  # the answer never ran
    stages[1] = http("facts", slow, "clean", timeout_ms=200, on_failure="skip", passes="clean")
    offer(gw, "support", pipeline(*stages))
    skipped = ask(gw)
    assert skipped.status == 200  # the question itself stood in for the facts
    assert gw.engine.seen[-1]["body"]["messages"][-1]["content"].startswith("Facts: My mail is [email]")
    metrics = gw.call("GET", "/metrics", tenant=None).body.decode()
    assert 'outcome="skipped",pipeline="support",stage="facts"' in metrics
    assert 'outcome="failed",pipeline="support",stage="facts"' in metrics  # the first, failed request


def test_the_budget_bounds_the_whole_graph(gw, services):
    slow = services(lambda i: "late", delay=1.0)
    offer(gw, "support", pipeline(REDACT, http("facts", slow, "clean"), PROMPT, ANSWER, budget_ms=300))
    answer = ask(gw)
    assert answer.status == 504
    assert "stage facts failed: the pipeline's budget of 300 ms ran out" in answer.json()["error"]["message"]


def test_a_failing_service_names_its_stage(gw, services):
    broken = services(lambda i: 1 / 0)  # the handler raises: the connection closes unanswered
    offer(gw, "support", pipeline(REDACT, http("facts", broken, "clean", timeout_ms=2000), PROMPT, ANSWER))
    answer = ask(gw)
    assert answer.status == 502 and "stage facts failed" in answer.json()["error"]["message"]


def test_an_unavailable_pipeline_is_refused_and_runs_nothing(gw, services):
    facts = services(lambda i: "x")
    route = pipeline(REDACT, http("facts", facts, "clean"), PROMPT, ANSWER)
    route["unavailable"], route["stages"] = "stage facts: US is outside acme's residency policy (EU)", []
    offer(gw, "support", route)
    answer = ask(gw)
    assert answer.status == 503 and answer.json()["error"]["code"] == "pipeline_unavailable"
    assert "stage facts: US is outside acme's residency policy" in answer.json()["error"]["message"]
    assert facts.got == [] and gw.engine.seen == []


def test_another_tenant_cannot_call_it_and_other_endpoints_refuse_it(gw, services):
    facts = services(lambda i: "x")
    offer(gw, "support", pipeline(REDACT, http("facts", facts, "clean"), PROMPT, ANSWER))
    other = gw.chat(tenant="globex", model="support")
    assert other.status == 404 and other.json()["error"]["code"] == "model_not_found"
    completion = gw.call("POST", "/v1/completions", {"model": "support", "prompt": "hi"})
    assert (
        completion.status == 400
        and "answers /v1/chat/completions only" in completion.json()["error"]["message"]
    )
    assert facts.got == []


def test_a_retrieve_stage_searches_the_tenants_index_by_cosine_and_refetches_a_newer_revision(gw, services):
    gw.control.indexes["acme/handbook"] = {
        "revision": 1,
        "dimensions": 3,
        "documents": [
            {"key": "refunds", "text": "Refunds take 30 days.", "vector": [1.0, 0.0, 0.0]},
            {"key": "shipping", "text": "Shipping takes 2 days.", "vector": [0.0, 1.0, 0.0]},
            {"key": "returns", "text": "Returns need a receipt.", "vector": [0.9, 0.0, 0.5]},
        ],
    }
    embed = services(lambda i: [10.0, 0.5, 0.0])  # stands in for an embedding model: near "refunds"
    search = {
        "name": "search",
        "kind": "retrieve",
        "inputs": {"vector": "vec"},
        "output": "documents",
        "timeout_ms": None,
        "on_failure": "fail",
        "index": "handbook",
        "top_k": 2,
        "revision": 1,
    }
    prompt = {**PROMPT, "inputs": {"facts": "search", "question": "request.query"}}
    offer(
        gw, "support", pipeline(http("vec", embed, "request.query", output="vector"), search, prompt, ANSWER)
    )
    assert ask(gw, question="refund?").status == 200
    sent = gw.engine.seen[-1]["body"]["messages"][-1]["content"]
    assert sent == "Facts: [1] Refunds take 30 days.\n[2] Returns need a receipt.\nQuestion: refund?"
    assert ask(gw, question="again").status == 200 and gw.control.index_fetches == 1  # held in memory
    gw.control.indexes["acme/handbook"]["documents"][0]["text"] = "Refunds take 14 days now."
    gw.control.indexes["acme/handbook"]["revision"] = 2
    offer(
        gw,
        "support",
        pipeline(
            http("vec", embed, "request.query", output="vector"), {**search, "revision": 2}, prompt, ANSWER
        ),
    )
    ask(gw)
    assert (
        gw.control.index_fetches == 2
        and "Refunds take 14 days now." in gw.engine.seen[-1]["body"]["messages"][-1]["content"]
    )
    wrong = services(lambda i: [1.0, 0.0])  # two dimensions for a three-dimension index
    offer(
        gw,
        "support",
        pipeline(
            http("vec", wrong, "request.query", output="vector"), {**search, "revision": 2}, prompt, ANSWER
        ),
    )
    failed = ask(gw)
    assert failed.status == 502 and "stage search failed" in failed.json()["error"]["message"]


def test_hostile_requests_and_answers_are_refused_by_name(gw, services):
    facts = services(lambda i: "x")
    offer(gw, "support", pipeline(REDACT, http("facts", facts, "clean"), PROMPT, ANSWER))
    for messages in ("hi", [], ["hi"], [{"role": "user", "content": "x"}, 3]):
        bad = gw.chat(model="support", messages=messages)
        assert bad.status == 400 and "messages must be a list" in bad.json()["error"]["message"], messages
    for content in ([{"type": "text", "text": 5}], [{"type": "text", "text": None}], [7], 3.5, None):
        odd = gw.chat(model="support", messages=[{"role": "user", "content": content}])
        assert odd.status == 200 and odd.headers["content-type"] == "application/json", content
    gw.gateway.routes.body["tenants"]["acme"]["blocked"] = "budget spent"
    assert ask(gw).status == 429
    gw.gateway.routes.body["tenants"]["acme"]["blocked"] = ""
    # Text parts are redacted too; a replacement is literal (no group references).
    parts = [{"role": "user", "content": [{"type": "text", "text": "write to ann@example.com"}]}]
    redact = {
        **REDACT,
        "inputs": {"messages": "request.messages"},
        "output": "messages",
        "replacement": r"\1 [x]",
    }
    answer = {**ANSWER, "inputs": {"messages": "clean"}}
    offer(gw, "support", pipeline(redact, answer))
    assert gw.chat(model="support", messages=parts).status == 200
    assert gw.engine.seen[-1]["body"]["messages"][0]["content"][0]["text"] == r"write to \1 [x]"
    router = services(lambda i: "refunds")  # a label it never declared
    billing = services(lambda i: "b")
    route = pipeline(
        http("topic", router, "request.query", output="label"),
        http(
            "billing",
            billing,
            "request.query",
            when={"stage": "topic", "labels": ["billing"], "otherwise": False},
        ),
        output=["billing"],
    )
    offer(gw, "support", route)
    odd = ask(gw)
    assert (
        odd.status == 502
        and "stage topic failed: it answered a label no alternative takes" in odd.json()["error"]["message"]
    )


def test_http_stages_do_not_reach_the_gateways_own_networks(tmp_path, services):
    closed = GatewayWorld(tmp_path, stage_networks=())  # the default: no network of the gateway's own side
    try:
        facts = services(lambda i: "secret")
        closed.gateway.routes.body["tenants"]["acme"]["pipelines"] = {
            "support": pipeline(REDACT, http("facts", facts, "clean"), PROMPT, ANSWER)
        }
        refused = closed.chat(model="support", messages=[{"role": "user", "content": "hi"}])
        assert refused.status == 502
        assert (
            "stage facts failed: its service is on a network the gateway does not call"
            in refused.json()["error"]["message"]
        )
        assert facts.got == []
    finally:
        closed.close()


@pytest.fixture
def pooling_engine(gw):
    """The simulator (vLLM's rerank and classify APIs) as the engine of acme's ranker and topics."""
    Handler.engine = Engine("m", max_model_len=2048)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    models = gw.gateway.routes.body["tenants"]["acme"]["models"]
    for name in ("ranker", "topics"):
        models[name] = {"endpoints": [endpoint(url)], "preferred": "eu-west-1"}
    yield url
    server.shutdown()


def model_stage(name: str, task: str, inputs: dict[str, str], output: str, **more: Any) -> dict:
    stage = {"name": name, "kind": "model", "inputs": inputs, "output": output, "timeout_ms": None}
    return {**stage, "on_failure": "fail", "task": task, **more}


def test_a_reranker_orders_the_documents_and_a_classifier_chooses_the_answer(gw, services, pooling_engine):
    library = services(
        lambda i: [{"text": "Shipping takes two days."}, {"text": "Refund requests take thirty days."}]
    )
    rerank = model_stage(
        "rank",
        "rerank",
        {"query": "request.query", "documents": "found"},
        "documents",
        route="ranker",
        top_n=1,
    )
    topic = model_stage("topic", "classify", {"text": "request.query"}, "label", route="topics")
    topic["labels"] = ["billing", "shipping"]
    prompt = {**PROMPT, "inputs": {"facts": "rank", "question": "request.query"}}
    billing = {**ANSWER, "when": {"stage": "topic", "labels": ["billing"], "otherwise": False}}
    general = {
        **ANSWER,
        "name": "general",
        "route": "shared",
        "when": {"stage": "topic", "labels": [], "otherwise": True},
    }
    route = pipeline(
        http("found", library, "request.query", output="documents"),
        rerank,
        topic,
        prompt,
        billing,
        general,
        output=["answer", "general"],
    )
    offer(gw, "support", route)
    answered = ask(gw, question="billing: how long do refund requests take?")
    assert answered.status == 200
    sent = gw.engine.seen[-1]["body"]
    assert sent["messages"][-1]["content"].startswith(
        "Facts: [1] Refund requests take thirty days.\nQuestion"
    )
    assert "Shipping" not in sent["messages"][-1]["content"]  # top_n 1: the best document only
    assert gw.ship() == 3  # rerank, classify and the answer: each metered as the request it is
    stages = {r["stage"]: r for r in gw.control.records}
    assert stages.keys() == {"rank", "topic", "answer"} and stages["rank"]["model_name"] == "ranker"
    assert stages["rank"]["prompt_tokens"] > 0 and stages["topic"]["prompt_tokens"] > 0
    # A label the classifier does not declare fails it, named (it would choose no branch).
    odd = ask(gw, question="weather today?")
    assert odd.status == 502
    assert (
        "stage topic failed: it answered 'weather', not one of its labels" in odd.json()["error"]["message"]
    )


def test_a_stage_answering_another_type_than_it_declares_fails_by_name(gw, services):
    vector = services(lambda i: "not a vector")
    search = services(lambda i: [{"title": "no text"}])
    prompt = {**PROMPT, "inputs": {"facts": "found", "question": "request.query"}}
    for stage, what in (
        (http("found", vector, "request.query", output="vector"), "a list of numbers"),
        (http("found", search, "request.query", output="documents"), 'a list of {"text": …}'),
    ):
        offer(gw, "support", pipeline(stage, prompt, ANSWER))
        failed = ask(gw)
        assert failed.status == 502
        assert f"stage found failed: its answer is not {what}" in failed.json()["error"]["message"]


def test_clients_call_rerank_and_classify_models_directly(gw, pooling_engine):
    ranked = gw.call(
        "POST", "/v1/rerank", body={"model": "ranker", "query": "cat", "documents": ["a dog", "the cat"]}
    )
    assert ranked.status == 200 and ranked.json()["results"][0]["document"]["text"] == "the cat"
    labelled = gw.call("POST", "/classify", body={"model": "topics", "input": "billing question"})
    assert labelled.status == 200 and labelled.json()["data"][0]["label"] == "billing"
    assert gw.ship() == 2
    assert {r["model_name"] for r in gw.control.records} == {"ranker", "topics"}


def test_a_model_stage_refused_keeps_its_meaning_rate_limits_429_bad_input_400(gw, pooling_engine):
    topic = model_stage("topic", "classify", {"text": "request.query"}, "label", route="topics")
    topic["labels"] = ["billing", "shipping"]
    offer(gw, "support", pipeline(topic, {**ANSWER, "inputs": {"messages": "request.messages"}}))
    gw.gateway.routes.body["tenants"]["acme"]["limits"] = {"requests_per_minute": 2}
    assert ask(gw, question="billing?").status == 200  # two requests: the classifier's and the answer's
    limited = ask(gw, question="billing?")
    assert limited.status == 429  # the tenant's limit, not a bad gateway: its client backs off
    error = limited.json()["error"]
    assert (
        error["code"] == "rate_limit_exceeded"
        and "stage topic failed: its model answered 429" in (error["message"])
    )
    models = gw.gateway.routes.body["tenants"]["acme"]["models"]
    gw.gateway.routes.body["tenants"]["acme"]["limits"] = {}
    models["topics"] = {**models["topics"], "endpoints": models["chat"]["endpoints"]}
    gw.engine.fail_status = 429  # an engine's own 429 is not the tenant's limit: the stage failed
    assert ask(gw, question="billing?").status == 502
    gw.engine.fail_status = 0
    gw.gateway.routes.body["tenants"]["acme"]["limits"] = {}
    summary = {**ANSWER, "name": "summary", "inputs": {"messages": "request.messages"}}
    prompt = {**PROMPT, "inputs": {"facts": "summary", "question": "request.query"}}
    offer(gw, "support", pipeline(summary, prompt, ANSWER))
    gw.engine.fail_status = 400  # what vLLM answers an input longer than its context
    refused = ask(gw)
    assert refused.status == 400 and refused.json()["error"]["code"] == "invalid_request"
    assert "stage summary failed: its model refused its input" in refused.json()["error"]["message"]
    gw.engine.fail_status = 500
    assert ask(gw).status == 502  # the engine's own failure stays the stage's


def test_a_pooling_api_the_model_does_not_serve_is_a_404_in_the_envelope(gw):
    gw.engine.fail_status, gw.engine.fail_body = 404, {"detail": "Not Found"}  # vLLM: an API not mounted
    body = {"model": "chat", "query": "q", "documents": ["a"]}
    refused = gw.call("POST", "/v1/rerank", body=body)
    assert refused.status == 404 and refused.json()["error"]["code"] == "unsupported_endpoint"
    assert refused.json()["error"]["message"] == "This model does not serve /v1/rerank: it runs another task."
    gw.engine.fail_body = {"error": {"message": "The model `chat` does not exist.", "code": 404}}
    unknown = gw.call("POST", "/v1/rerank", body=body)  # another 404 of vLLM's: passed on as it is
    assert unknown.status == 404 and unknown.json() == gw.engine.fail_body


def test_an_http_stage_sends_its_secret_as_a_bearer_token_or_is_not_called(gw, services):
    facts = services(lambda i: "facts")
    keyed = http("facts", facts, "clean", secret="search-key", secret_version="7.1", secret_value="tok-1")
    offer(gw, "support", pipeline(REDACT, keyed, PROMPT, ANSWER))
    assert ask(gw).status == 200 and facts.authorizations == ["Bearer tok-1"]
    plain = services(lambda i: "facts")
    offer(gw, "support", pipeline(REDACT, http("facts", plain, "clean"), PROMPT, ANSWER))
    assert ask(gw).status == 200 and plain.authorizations == [None]  # no secret: no Authorization at all
    unreadable = {
        k: v for k, v in keyed.items() if k != "secret_value"
    }  # the control plane could not open it
    offer(gw, "support", pipeline(REDACT, unreadable, PROMPT, ANSWER))
    refused = ask(gw)
    assert refused.status == 503
    assert "stage facts failed: its secret search-key cannot be read" in refused.json()["error"]["message"]
    assert len(facts.got) == 1  # never called without it


def test_a_regional_gateway_outside_the_tenants_residency_runs_none_of_its_pipelines(tmp_path, services):
    facts = services(lambda i: "facts")
    route = pipeline(REDACT, http("facts", facts, "clean"), PROMPT, ANSWER)
    for regions, served in (
        ({"eu-west-1"}, True),
        ({"us-east-1"}, False),
        ({"eu-west-1", "us-east-1"}, False),
    ):
        world = GatewayWorld(tmp_path / "-".join(sorted(regions)), regions=frozenset(regions))
        try:
            table = world.control.table
            table["tenants"]["acme"]["pipelines"] = {"support": {**route, "regions": ["eu-west-1"]}}
            world.gateway.routes.install(table, "e1", 1)
            answer = world.chat(model="support", messages=[{"role": "user", "content": "hi"}])
            if served:
                assert answer.status == 200
            else:
                assert answer.status == 503, answer.body
                assert "may not be processed in us-east-1" in answer.json()["error"]["message"]
        finally:
            world.close()
    assert len(facts.got) == 1  # only the EU gateway called the tenant's service


class Rebinding(AbstractResolver):
    """A public-looking name whose DNS answer is this host's loopback (as a rebinding host answers once it
    has passed whatever was checked before): the gateway judges the address it connects to."""

    async def resolve(self, host: str, port: int = 0, family: Any = socket.AF_INET) -> list[Any]:
        found = {
            "hostname": host,
            "host": "127.0.0.1",
            "port": port,
            "family": family,
            "proto": 0,
            "flags": 0,
        }
        return [found]

    async def close(self) -> None:
        pass


def test_a_host_rebinding_to_the_gateways_own_network_is_refused_at_the_connection(tmp_path, services):
    closed = GatewayWorld(tmp_path, stage_networks=())
    try:
        facts = services(lambda i: "internal secrets")
        port = urlsplit(facts.url).port

        # The gateway's own stage network (its session made on first use), resolving by the rebinding DNS.
        closed.gateway.stage_network.resolver = Rebinding()
        closed.gateway.routes.body["tenants"]["acme"]["pipelines"] = {
            "support": pipeline(
                REDACT,
                {**http("facts", facts, "clean"), "url": f"http://rebound.example:{port}/"},
                PROMPT,
                ANSWER,
            )
        }
        refused = closed.chat(model="support", messages=[{"role": "user", "content": "hi"}])
        assert refused.status == 502
        message = refused.json()["error"]["message"]
        assert "stage facts failed" in message and "network the gateway does not call" in message
        assert facts.got == []  # never reached
    finally:
        closed.close()


def test_the_network_rule_refuses_internal_addresses_of_every_kind():
    rule = Addresses([])
    internal = ["127.0.0.1", "10.1.2.3", "169.254.169.254", "100.100.100.200", "::1", "fe80::1%eth0"]
    internal += ["224.0.0.1", "0.0.0.0", "::ffff:127.0.0.1", "2002:7f00:1::1", "fd00::1", "192.0.2.1"]
    for address in internal:
        assert rule.refused(address), address
    assert not rule.refused("93.184.215.14") and not rule.refused("2606:2800:220:1::1")
    assert not Addresses(["10.0.0.0/8"]).refused("10.1.2.3")  # allowed by the operator


def test_a_pipeline_with_no_model_stage_is_rate_limited_as_one_request(gw, services):
    facts = services(lambda i: "facts")
    gw.gateway.routes.body["tenants"]["acme"]["limits"] = {"requests_per_minute": 2}
    offer(gw, "support", pipeline(REDACT, http("facts", facts, "clean")))
    statuses = [ask(gw).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert len(facts.got) == 2  # the refused request ran no stage
    # With a model stage, each model stage is admitted as the request it is (and the run is not counted).
    gw.gateway.routes.body["tenants"]["acme"]["limits"] = {"concurrent_requests": 1}
    offer(gw, "support", pipeline(REDACT, http("facts", facts, "clean"), PROMPT, ANSWER))
    assert ask(gw).status == 200  # its one place is the answer's, not taken by the run itself


def test_a_branch_that_answers_without_a_model_counts_the_run_as_a_request():
    router = {"name": "topic", "kind": "http", "inputs": {"input": "request.query"}, "output": "label"}
    by_model = {**ANSWER, "inputs": {"messages": "request.messages"}, "when": {"stage": "topic"}}
    by_service = {
        "name": "canned",
        "kind": "http",
        "inputs": {"input": "request.query"},
        "when": {"stage": "topic"},
    }
    both = pipeline(router, by_model, by_service, output=["answer", "canned"])
    assert not every_answer_runs_a_model(both)  # "canned" answers with no model: the run is counted
    assert every_answer_runs_a_model(pipeline(router, by_model, output=["answer"]))
    classifier = {**router, "kind": "model", "task": "classify"}  # every branch waits for a model
    assert every_answer_runs_a_model(pipeline(classifier, by_model, by_service, output=["answer", "canned"]))
    assert not every_answer_runs_a_model(pipeline(REDACT))
