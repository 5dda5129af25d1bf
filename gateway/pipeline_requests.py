"""A client's request for a pipeline, as the gateway serves it: refused before any stage runs when it must
be, rate limited as one request when no model stage will count it, run (gateway/pipelines.py) with each
model stage a request of its own through the gateway's ``handle``, traced and measured per stage."""

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import aiohttp

from gateway import contract
from gateway.config import RouteCache
from gateway.fleet_limits import FleetLimits
from gateway.limits import over_budget, rate_limited
from gateway.metrics import GatewayMetrics
from gateway.pipelines import PipelineRun, Send, StageFailed
from gateway.reply import Reply
from gateway.retrieval import Indexes
from gateway.stage_network import StageNetwork
from gateway.tracing import Tracing, finish_pipeline

log = logging.getLogger("gateway")
Handle = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class PipelineRequests:
    def __init__(
        self,
        handle: Handle,
        routes: RouteCache,
        limits: FleetLimits,
        metrics: GatewayMetrics,
        tracing: Tracing,
        indexes: Indexes,
        network: StageNetwork,
    ):
        self.handle, self.routes, self.limits, self.metrics = handle, routes, limits, metrics
        self.tracing, self.indexes, self.network = tracing, indexes, network

    async def serve(
        self,
        session: aiohttp.ClientSession,
        scope: dict[str, Any],
        send: Any,
        reply: Reply,
        tenant: str,
        name: str,
        pipeline: contract.PipelineRoute,
        payload: dict[str, Any],
        headers: dict[str, str],
    ) -> None:
        view = self.routes.view(tenant)
        refused = pipeline_refusal(tenant, name, pipeline, payload, view.get("blocked"))
        if refused is not None:
            return await reply.error(*refused)
        # Model stages are admitted each as the request it is; a pipeline that may answer without one
        # (no model stage, or a branch without one) counts as one request itself.
        limits = {} if every_answer_runs_a_model(pipeline) else view.get("limits", {})
        refused_by, ticket = await self.limits.admit(tenant, limits, reply.request_id)
        if refused_by:
            self.metrics.refuse(tenant, "rate_limit")
            return await reply.error(*rate_limited(tenant, refused_by))
        call = partial(stage_request, self.handle, scope)
        run = PipelineRun(name, pipeline, payload, call, session, tenant, self.indexes, self.network)
        try:
            await self._traced(run, send, reply, headers)
        finally:
            await self.limits.finish(ticket, 0)

    async def _traced(self, run: PipelineRun, send: Any, reply: Reply, headers: dict[str, str]) -> None:
        """The run: a span whose children are the stages' (and theirs the model requests')."""
        version = run.route["version"]
        about = {"gateway.tenant": run.tenant, "gateway.request_id": reply.request_id}
        span = self.tracing.start(headers, "/v1/chat/completions", run.name, about)
        if span is not None:
            span.set_attribute("gateway.pipeline", version)
        run.trace = partial(self.tracing.stage, span, version)
        status = 200
        try:
            await run.run(send)
        except StageFailed as failed:
            status = failed.status
            if not run.answering:  # an answer already started cannot be replaced by an error
                message = f"{run.name}: stage {failed.stage} failed: {failed.message}."
                await reply.error(failed.status, message, failed.code)
        except Exception:  # a bug: logged, answered with the envelope, the span and metrics still closed
            log.exception("pipeline %s failed for %s", run.name, run.tenant)
            status = 500
            if not run.answering:
                await reply.error(500, f"{run.name} failed inside the gateway.", "internal_error")
        finally:
            finish_pipeline(span, status)
            for stage, (outcome, seconds) in run.took.items():
                self.metrics.stage(run.tenant, run.name, stage, outcome, seconds)


def every_answer_runs_a_model(pipeline: contract.PipelineRoute) -> bool:
    """Whether every way the pipeline can answer runs a model stage: each answering alternative, or
    something it waits for (its inputs, its chooser, theirs), is a model stage."""
    stages = {s["name"]: s for s in pipeline["stages"]}

    def modelled(name: str) -> bool:
        seen, todo = set(), [name]
        while todo:
            stage = stages[todo.pop()]
            if stage["kind"] == "model":
                return True
            seen.add(stage["name"])
            sources = set(stage["inputs"].values()) | ({stage["when"]["stage"]} if "when" in stage else set())
            todo += [s for s in sources if s in stages and s not in seen]
        return False

    return bool(stages) and all(modelled(name) for name in pipeline["output"])


def pipeline_refusal(
    tenant: str, name: str, route: contract.PipelineRoute, payload: dict[str, Any], blocked: str | None
) -> tuple[int, str, str] | None:
    """Why the request is refused before any stage runs (status, message, code); None to run it."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        return 400, "messages must be a list of message objects.", "invalid_request"
    if blocked:
        return over_budget(tenant, blocked)
    if "unavailable" in route:
        return 503, f"{name} cannot run now: {route['unavailable']}.", "pipeline_unavailable"
    return None


async def stage_request(
    handle: Callable[[dict[str, Any], Any, Any], Awaitable[None]],
    scope: dict[str, Any],
    stage: tuple[str, str],
    path: str,
    body: dict[str, Any],
    send: Send | None,
    trace: dict[str, str],
) -> tuple[int, bytes]:
    """A stage's request to a model, handled by the gateway's ``handle`` as a client's would be, with the
    client's own headers but the stage's ``traceparent`` (``trace``: its span is the stage's child): the
    status, and the body when ``send`` is None (else the response went to ``send``). The scope names
    the stage for its usage record (a scope key no client can set)."""
    data = json.dumps(body).encode()
    skip = {b"content-length", b"content-type", b"traceparent", b"tracestate"}
    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in skip]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in trace.items()]
    inner = {**scope, "path": path, "raw_path": path.encode(), "query_string": b"", "headers": headers}
    inner["pipeline"] = stage
    status, kept = [0], list[bytes]()
    delivered = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if delivered.is_set():
            await asyncio.Event().wait()  # no disconnect to report: the stage waits as long as it runs
        delivered.set()
        return {"type": "http.request", "body": data, "more_body": False}

    async def answer(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status[0] = message["status"]
        if send is not None:
            await send(message)
        elif message["type"] == "http.response.body":
            kept.append(message.get("body", b""))

    await handle(inner, receive, answer)
    return status[0], b"".join(kept)
