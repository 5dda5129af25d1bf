"""OpenTelemetry traces: with an OTLP endpoint configured, every forwarded request is a span with the routing
decision, exported over OTLP/HTTP (protobuf) to a real receiver run by the test, its traceparent passed on to
the engine, its trace id on the usage record; a client's traceparent becomes the parent; off by default."""

import pytest

from tests.support.gateway_harness import GatewayWorld, endpoint
from tests.support.otlp import Receiver, attributes


@pytest.fixture
def traced(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    receiver = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    world = GatewayWorld(tmp_path)
    yield world, receiver
    world.close()
    receiver.server.shutdown()


def test_a_forwarded_request_is_a_span_exported_over_otlp_and_continued_by_the_engine(traced):
    gw, receiver = traced
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    answer = gw.chat(headers={"traceparent": f"00-{client_trace}-00f067aa0ba902b7-01"}, stream=True)
    assert answer.status == 200
    gw.gateway.tracing.provider.force_flush()
    ((service, span),) = receiver.spans
    assert service == "llm-gateway" and span.name == "chat chat"
    assert span.trace_id.hex() == client_trace  # the client's trace goes on
    found = attributes(span)
    assert found["gen_ai.operation.name"] == "chat" and found["gen_ai.response.model"] == "m@1"
    assert found["gateway.tenant"] == "acme" and found["gateway.region"] == "eu-west-1"
    assert found["gateway.attempts"] == 1 and found["http.response.status_code"] == 200
    assert found["gen_ai.usage.output_tokens"] == 2
    sent = gw.engine.seen[-1]["headers"]["traceparent"]
    assert sent.split("-")[1] == client_trace and sent.split("-")[2] == span.span_id.hex()
    gw.ship()
    assert gw.control.records[-1]["trace_id"] == client_trace


def test_a_failed_attempt_and_a_bad_traceparent(traced):
    gw, receiver = traced
    (healthy,) = gw.engines(1)
    gw.engine.fail_status = 503
    gw.serve(
        {"endpoints": [endpoint(gw.engine.url), {**endpoint(healthy.url), "priority": 1}], "preferred": ""}
    )
    assert gw.chat(headers={"traceparent": "00-zz-not-a-trace"}).status == 200
    gw.gateway.tracing.provider.force_flush()
    ((_, span),) = receiver.spans
    assert attributes(span)["gateway.attempts"] == 2 and attributes(span)["gateway.tier"] == 1
    assert span.trace_id.hex() != "0" * 32 and len(span.parent_span_id) == 0  # a new trace of its own


def test_without_an_otlp_endpoint_nothing_is_traced(gw):
    assert gw.gateway.tracing.provider is None
    assert gw.chat().status == 200
    assert "traceparent" not in gw.engine.seen[-1]["headers"]


def test_an_ipv6_engine_and_a_huge_tracestate_are_traced_without_trouble(traced):
    gw, receiver = traced
    gw.serve({"endpoints": [{**endpoint(gw.engine.url), "url": "http://[::1]:9"}], "preferred": ""})
    answer = gw.chat(headers={"tracestate": "x=" + "y" * 60_000})  # [::1]:9 refuses: 502, still a span
    assert answer.status == 502
    gw.gateway.tracing.provider.force_flush()
    ((_, span),) = receiver.spans
    found = attributes(span)
    assert found["server.address"] == "::1" and found["server.port"] == 9 and found["error.type"] == "502"


def test_a_pipeline_run_is_a_span_whose_children_are_its_stages_and_theirs_the_model_requests(traced):
    gw, receiver = traced
    redact = {
        "name": "clean",
        "kind": "redact",
        "inputs": {"messages": "request.messages"},
        "output": "messages",
        "timeout_ms": None,
        "on_failure": "fail",
        "patterns": ["secret"],
        "replacement": "x",
    }
    answer = {
        "name": "answer",
        "kind": "model",
        "inputs": {"messages": "clean"},
        "output": "text",
        "timeout_ms": None,
        "on_failure": "fail",
        "route": "chat",
        "task": "chat",
    }
    route = {
        "version": "acme/support@1.0.0",
        "budget_ms": 5000,
        "output": ["answer"],
        "stages": [redact, answer],
    }
    gw.gateway.routes.body["tenants"]["acme"]["pipelines"] = {"support": route}
    client_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {"traceparent": f"00-{client_trace}-00f067aa0ba902b7-01"}
    assert gw.chat(model="support", headers=headers, stream=True).status == 200
    gw.gateway.tracing.provider.force_flush()
    spans = [span for _, span in receiver.spans]
    assert sorted(s.name for s in spans) == ["chat chat", "chat chat", "chat support", "redact clean"]
    (run,) = [s for s in spans if s.name == "chat support"]
    (clean,) = [s for s in spans if s.name == "redact clean"]
    (stage_answer,) = [s for s in spans if attributes(s).get("gateway.pipeline.stage_kind") == "model"]
    (request,) = [s for s in spans if "gen_ai.provider.name" in attributes(s) and s is not run]
    assert {s.trace_id.hex() for _, s in receiver.spans} == {client_trace}  # one trace, the client's
    assert clean.parent_span_id == run.span_id and stage_answer.parent_span_id == run.span_id
    assert attributes(run)["gateway.pipeline"] == "acme/support@1.0.0"
    assert attributes(clean)["gateway.pipeline.stage"] == "clean"
    assert attributes(clean)["gateway.pipeline.outcome"] == "ok"
    assert request.parent_span_id == stage_answer.span_id  # the model request is the stage's child
    assert attributes(request)["gateway.pipeline.stage"] == "answer"
    sent = gw.engine.seen[-1]["headers"]["traceparent"]
    assert sent.split("-")[2] == request.span_id.hex()  # and the engine continues from the request
