"""OpenTelemetry traces of the requests the gateway forwards: a span per request with the routing decision,
its W3C ``traceparent`` passed on to the engine (vLLM continues the trace with its ``llm_request`` span
when started with ``--otlp-traces-endpoint``) and its trace id on the usage record.

Configured by the standard variables and off without them: ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` (OTLP over HTTP, protobuf), ``OTEL_SERVICE_NAME`` (default
``llm-gateway``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_BSP_*`` for the batching, ``OTEL_SDK_DISABLED``.
Spans are exported in batches on the SDK's own thread: a slow or absent collector never delays a request.

A client's own ``traceparent`` is honoured as the parent (the trace then starts in the client's code); it
is only an id, so nothing a client sends there can change what the gateway does.
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway import contract
from gateway.metering import Outcome, usage_tokens

OPERATIONS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "text_completion",
    "/v1/embeddings": "embeddings",
    # Names of our own (the GenAI conventions define none for these): documented in docs/pipelines.md.
    "/v1/rerank": "rerank",
    "/classify": "classify",
}
# A pipeline's model stage's span, by its task (the GenAI names; rerank and classify are our own).
STAGE_OPERATIONS = {
    "chat": "chat",
    "completion": "text_completion",
    "embed": "embeddings",
    "rerank": "rerank",
    "classify": "classify",
}
PROPAGATOR = TraceContextTextMapPropagator()


@dataclass
class StageTrace:
    """A pipeline stage's span as the run sees it: the ``traceparent`` its model request carries (so the
    request's span, and the engine's, are the stage's children) and how the stage ended."""

    headers: dict[str, str]
    outcome: str = "ok"


def configured() -> bool:
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    if os.environ.get("OTEL_TRACES_EXPORTER", "otlp") == "none":
        return False
    return bool(
        os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    )


class Tracing:
    def __init__(self) -> None:
        self.provider: TracerProvider | None = None
        if configured():
            name = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "llm-gateway"}
            self.provider = TracerProvider(resource=Resource.create(name))
            self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            self.tracer = self.provider.get_tracer("gateway")

    def start(
        self, headers: dict[str, str], path: str, model: str, attributes: dict[str, Any]
    ) -> Span | None:
        """The request's span (None when tracing is off), a child of the client's ``traceparent`` if any."""
        if self.provider is None:
            return None
        operation = OPERATIONS.get(path, "chat")
        # Only the 55 characters of a traceparent: a client's tracestate (vendor data, up to the header limit)
        # is neither logged when malformed nor passed on.
        parent = PROPAGATOR.extract({"traceparent": headers.get("traceparent", "")[:55]})
        return self.tracer.start_span(
            f"{operation} {model}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": "vllm",
                "gen_ai.request.model": model,
                **attributes,
            },
        )

    @contextmanager
    def stage(self, parent: Span | None, version: str, stage: contract.PipelineStage) -> Iterator[StageTrace]:
        """A span for one stage of a pipeline's run, a child of the pipeline's span; a stage failing ends
        it as an error (its outcome ``skipped`` when its policy passed its input on instead)."""
        if self.provider is None or parent is None:
            yield StageTrace({})
            return
        operation, target = _stage_operation(stage)
        attributes = {
            "gen_ai.operation.name": operation,
            "gateway.pipeline": version,
            "gateway.pipeline.stage": stage["name"],
            "gateway.pipeline.stage_kind": stage["kind"],
        }
        if stage["kind"] == "retrieve":
            attributes["gen_ai.data_source.id"] = stage["index"]
        span = self.tracer.start_span(
            f"{operation} {target}", context=set_span_in_context(parent), attributes=attributes
        )
        traced = StageTrace(upstream_headers(span))
        try:
            yield traced
        except BaseException as exc:
            traced.outcome = "failed"
            span.set_attribute("error.type", type(exc).__name__)
            span.set_status(Status(StatusCode.ERROR))
            raise
        finally:
            span.set_attribute("gateway.pipeline.outcome", traced.outcome)
            span.end()

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()


def upstream_headers(span: Span | None) -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) naming the span, for the engine's request."""
    if span is None:
        return {}
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=set_span_in_context(span))
    return carrier


def _stage_operation(stage: contract.PipelineStage) -> tuple[str, str]:
    if stage["kind"] == "model":
        return STAGE_OPERATIONS[stage["task"]], stage["route"]
    if stage["kind"] == "retrieve":
        return "retrieval", stage["index"]
    return stage["kind"], stage["name"]  # http, redact, template: our own names


def finish_pipeline(span: Span | None, status: int) -> None:
    if span is None:
        return
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_attribute("error.type", str(status))
        span.set_status(Status(StatusCode.ERROR))
    span.end()


def _port(url: SplitResult) -> int:
    try:
        return url.port or (443 if url.scheme == "https" else 80)
    except ValueError:  # not a port at all: the table never sends one, but a span must not fail a request
        return 0


def trace_id(span: Span | None) -> str:
    if span is None or isinstance(span, NonRecordingSpan):
        return ""
    return format(span.get_span_context().trace_id, "032x")


def finish(span: Span | None, outcome: Outcome, attempts: int, degraded: str, cache: str = "") -> None:
    """What the routing decided and how the exchange ended, then the span's end."""
    if span is None:
        return
    endpoint = outcome.endpoint
    if endpoint is not None:
        url = urlsplit(endpoint["url"])
        span.set_attributes(
            {
                "gen_ai.response.model": endpoint["version"],
                "gen_ai.usage.input_tokens": usage_tokens(outcome.usage, "prompt_tokens"),
                "gen_ai.usage.output_tokens": usage_tokens(outcome.usage, "completion_tokens"),
                "server.address": url.hostname or "",
                "server.port": _port(url),
                "gateway.region": endpoint["region"],
                "gateway.tier": endpoint["priority"],
                "gateway.track": endpoint.get("track", contract.STABLE),
                "gateway.deployment": endpoint["deployment"],
            }
        )
    span.set_attributes(
        {
            "http.response.status_code": outcome.status,
            "gateway.attempts": attempts,
            "gateway.degraded": degraded,
            "gateway.cache": cache,  # hit, miss, or '' when the request was not to be cached
        }
    )
    if outcome.ttft_ms is not None:
        span.set_attribute("gateway.time_to_first_token_ms", round(outcome.ttft_ms, 2))
    if outcome.status >= 500:
        span.set_attribute("error.type", str(outcome.status))
        span.set_status(Status(StatusCode.ERROR))
    span.end()
