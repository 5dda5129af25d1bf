"""Running a pipeline: its stages in order, side by side where none waits for another, each model stage
sent through the gateway's own handling of a direct request (the same authentication, routing,
residency, limits and metering), the answering stage's response streamed to the client as it comes.

The graph was checked when it was defined (registry/pipelines.py); the route table carries it with each
model stage resolved to the tenant's model name (contract.PipelineRoute). A stage that fails or overruns
its timeout fails the request (502/504 naming the stage), or, ``on_failure: skip``, passes its input of
its output's type on in its place. The budget bounds everything up to the answer's first byte.
"""

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import aiohttp
import re2

from gateway import contract
from gateway.limits import OVER_BUDGET, RATE_LIMITED
from gateway.retrieval import Indexes
from gateway.stage_network import StageNetwork
from gateway.tracing import StageTrace

# How a model stage's task is asked of an engine, and what of its answer flows on.
TASK_PATHS = dict(
    zip(
        contract.PIPELINE_TASKS,
        ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank", "/classify"),
        strict=True,
    )
)
DEFAULT_MAX_TOKENS = 256  # a stage before the answer that sets none
MAX_STAGE_ANSWER = 4 * 1024 * 1024  # bytes an http stage's service may answer
Send = Callable[[dict[str, Any]], Awaitable[None]]
# ((pipeline version, stage), path, body, send, trace headers) → the status, and the body when ``send``
# is None (the stage's answer is kept)
Call = Callable[
    [tuple[str, str], str, dict[str, Any], Send | None, dict[str, str]], Awaitable[tuple[int, bytes]]
]
Trace = Callable[[contract.PipelineStage], AbstractContextManager[StageTrace]]


@contextmanager
def untraced(stage: contract.PipelineStage) -> Iterator[StageTrace]:
    yield StageTrace({})


class StageFailed(Exception):
    def __init__(self, stage: str, status: int, message: str, code: str = "pipeline_stage_failed"):
        super().__init__(message)
        self.stage, self.status, self.message, self.code = stage, status, message, code


def last_user_text(messages: Any) -> str:
    """``request.query``: the content of the last user message (text parts joined)."""
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):  # text parts (a client's, so any types: only text is text)
                return " ".join(
                    p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
            return content if isinstance(content, str) else ""
    return ""


class PipelineRun:
    """One request through one pipeline."""

    def __init__(
        self,
        name: str,
        route: contract.PipelineRoute,
        payload: dict[str, Any],
        call: Call,
        session: aiohttp.ClientSession,
        tenant: str,
        indexes: Indexes,
        network: StageNetwork,
        trace: Trace = untraced,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.name, self.route, self.payload, self.call = name, route, payload, call
        self.session, self.tenant, self.indexes, self.clock = session, tenant, indexes, clock
        self.network, self.trace = network, trace
        self.trace_headers: dict[str, dict[str, str]] = {}  # stage → its span's traceparent
        self.deadline = clock() + route["budget_ms"] / 1000
        messages = payload.get("messages")
        self.values: dict[str, Any] = {
            "request.messages": messages,
            "request.query": last_user_text(messages),
        }
        self.skipped: set[str] = set()  # conditional stages whose condition did not hold
        self.took: dict[str, tuple[str, float]] = {}  # stage → (ok, skipped or failed; seconds)
        self.answering = False  # the answer's response has started: an error can no longer be sent

    async def run(self, send: Send) -> None:
        """Run every stage the answer needs, then the answer, its response sent to ``send``."""
        stages = self.route["stages"]
        answer = [s for s in stages if s["name"] in self.route["output"]]
        pending = [s for s in stages if s["name"] not in self.route["output"]]
        while pending:
            ready = [s for s in pending if self._sources_done(s)]
            if not ready:  # the registry refuses such graphs; never spin on one
                raise StageFailed(pending[0]["name"], 500, "its sources never ran")
            pending = [s for s in pending if s not in ready]
            try:  # side by side; one failing cancels the others (their requests stop, unbilled)
                async with asyncio.TaskGroup() as group:
                    for stage in ready:
                        group.create_task(self._stage(stage))
            except* StageFailed as failed:
                raise failed.exceptions[0] from None
        chosen = [s for s in answer if self._holds(s)]
        if len(chosen) != 1:  # a label stage (a tenant's service) answered a label it did not declare
            chooser = answer[0].get("when", {}).get("stage", answer[0]["name"])
            raise StageFailed(chooser, 502, "it answered a label no alternative takes")
        await self._answer(chosen[0], send)

    def _sources_done(self, stage: contract.PipelineStage) -> bool:
        sources = set(stage["inputs"].values()) | ({stage["when"]["stage"]} if "when" in stage else set())
        return all(s in self.values or s in self.skipped for s in sources)

    def _holds(self, stage: contract.PipelineStage) -> bool:
        """Whether the stage runs: no condition, or its chooser ran and said one of its labels."""
        when = stage.get("when")
        if when is None:
            return True
        if when["stage"] in self.skipped:
            return False
        label = str(self.values.get(when["stage"], ""))
        return (
            label not in self._named_labels(when["stage"]) if when["otherwise"] else label in when["labels"]
        )

    def _named_labels(self, chooser: str) -> set[str]:
        return {
            label
            for s in self.route["stages"]
            if s.get("when", {}).get("stage") == chooser
            for label in s["when"]["labels"]
        }

    async def _stage(self, stage: contract.PipelineStage) -> None:
        name = stage["name"]
        if not self._holds(stage) or any(s in self.skipped for s in stage["inputs"].values()):
            self.skipped.add(name)
            return
        started, timeout = self.clock(), self._timeout(stage)
        outcome = "failed"
        with self.trace(stage) as traced:
            self.trace_headers[name] = traced.headers
            try:
                self.values[name] = _declared(stage, await asyncio.wait_for(self._work(stage), timeout))
                outcome = "ok"
            except Exception as exc:  # whatever went wrong, it is this stage's failure, named (never a 500)
                if stage["on_failure"] != "skip":
                    raise _failure(stage, exc, timeout, self.route["budget_ms"]) from None
                self.values[name], outcome = self.values[stage["passes"]], "skipped"
            finally:
                traced.outcome, self.took[name] = outcome, (outcome, self.clock() - started)

    def _timeout(self, stage: contract.PipelineStage) -> float:
        left = self.deadline - self.clock()
        if left <= 0:
            raise StageFailed(
                stage["name"], 504, f"the pipeline's budget of {self.route['budget_ms']} ms is spent"
            )
        own = stage["timeout_ms"]
        return min(left, own / 1000) if own else left

    def _inputs(self, stage: contract.PipelineStage) -> dict[str, Any]:
        return {param: self.values[source] for param, source in stage["inputs"].items()}

    async def _work(self, stage: contract.PipelineStage) -> Any:
        inputs = self._inputs(stage)
        kind = stage["kind"]
        if kind == "template":
            return _fill(stage, inputs)
        if kind == "redact":
            return _redact(stage, next(iter(inputs.values())))
        if kind == "http":
            return await self._http(stage, inputs)
        if kind == "retrieve":
            found = await self.indexes.search(
                self.session, self.tenant, stage["index"], stage["revision"], inputs["vector"], stage["top_k"]
            )
            return found
        tag, trace = (self.route["version"], stage["name"]), self.trace_headers.get(stage["name"], {})
        status, body = await self.call(
            tag, TASK_PATHS[stage["task"]], _model_body(stage, inputs), None, trace
        )
        if status != 200:
            raise StageFailed(stage["name"], *_model_refusal(status, body))
        return _model_output(stage, inputs, json.loads(body))

    async def _http(self, stage: contract.PipelineStage, inputs: dict[str, Any]) -> Any:
        """A tenant's own service: POST {"inputs": {...}}, answered {"output": ...}. Never to an address of
        the gateway's own networks (unless the operator allows it), never following a redirect, never
        reading more than MAX_STAGE_ANSWER bytes."""
        refused = self.network.check(stage["url"])
        if refused:
            raise StageFailed(stage["name"], 502, refused)
        sent = {"inputs": inputs}
        headers = {}
        if "secret" in stage:  # the tenant's own secret: without its value, the stage is not called at all
            if "secret_value" not in stage:
                raise StageFailed(stage["name"], 503, f"its secret {stage['secret']} cannot be read")
            headers["Authorization"] = f"Bearer {stage['secret_value']}"
        try:
            return await self._post(stage, sent, headers)
        except aiohttp.ClientConnectorError as exc:
            raise StageFailed(stage["name"], 502, self.network.refusal(exc) or str(exc)[:300]) from None

    async def _post(
        self, stage: contract.PipelineStage, sent: dict[str, Any], headers: dict[str, str]
    ) -> Any:
        calling = self.network.session().post(stage["url"], json=sent, headers=headers, allow_redirects=False)
        async with calling as answered:
            if answered.status != 200:
                raise StageFailed(stage["name"], 502, f"its service answered {answered.status}")
            body = bytearray()
            async for chunk in answered.content.iter_chunked(65536):
                body += chunk
                if len(body) > MAX_STAGE_ANSWER:
                    raise StageFailed(stage["name"], 502, f"its answer is over {MAX_STAGE_ANSWER} bytes")
            return json.loads(body)["output"]

    async def _stream_answer(
        self,
        stage: contract.PipelineStage,
        body: dict[str, Any],
        relay: Send,
        first: asyncio.Event,
        traced: StageTrace,
    ) -> None:
        started, timeout = self.clock(), self._timeout(stage)
        tag = (self.route["version"], stage["name"])
        task = asyncio.ensure_future(self.call(tag, TASK_PATHS["chat"], body, relay, traced.headers))
        began = asyncio.ensure_future(first.wait())
        await asyncio.wait({task, began}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        began.cancel()
        if not first.is_set() and not task.done():
            task.cancel()
            self.took[stage["name"]] = ("failed", self.clock() - started)
            raise _failure(stage, TimeoutError(), timeout, self.route["budget_ms"])
        status, _ = await task
        traced.outcome = "ok" if status == 200 else "failed"
        self.took[stage["name"]] = (traced.outcome, self.clock() - started)

    async def _answer(self, stage: contract.PipelineStage, send: Send) -> None:
        """The answering stage: a chat model streams straight to the client; anything else is answered as
        one chat completion. The budget bounds the wait for its first byte."""
        if stage["kind"] == "model" and stage["task"] == "chat":
            inputs = self._inputs(stage)
            body = {**self.payload, "model": stage["route"], "messages": next(iter(inputs.values()))}
            if "max_tokens" in stage and "max_tokens" not in self.payload:
                body["max_tokens"] = stage["max_tokens"]
            first = asyncio.Event()

            async def relay(message: dict[str, Any]) -> None:
                first.set()
                self.answering = True
                await send(message)

            with self.trace(stage) as traced:
                await self._stream_answer(stage, body, relay, first, traced)
            return
        await self._stage(stage)
        self.answering = True
        await _completion(send, self.name, str(self.values[stage["name"]]), bool(self.payload.get("stream")))


def _failure(
    stage: contract.PipelineStage, exc: BaseException, timeout: float, budget_ms: int
) -> StageFailed:
    if isinstance(exc, StageFailed):
        return exc
    if isinstance(exc, TimeoutError):
        own = stage["timeout_ms"]
        if own and timeout * 1000 >= own - 0.5:  # its own timeout, not what was left of the budget
            message = f"it took longer than {own} ms"
        else:
            message = f"the pipeline's budget of {budget_ms} ms ran out while it ran"
        return StageFailed(stage["name"], 504, message, "pipeline_timeout")
    return StageFailed(stage["name"], 502, f"{type(exc).__name__}: {exc}"[:300])


SHAPES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "text": ("text", lambda v: isinstance(v, str)),
    "messages": ("a list of messages", lambda v: isinstance(v, list) and all(isinstance(m, dict) for m in v)),
    "vector": (
        "a list of numbers",
        lambda v: (
            isinstance(v, list) and all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
        ),
    ),
    "documents": (
        'a list of {"text": …}',
        lambda v: (
            isinstance(v, list) and all(isinstance(d, dict) and isinstance(d.get("text"), str) for d in v)
        ),
    ),
    "label": ("a label", lambda v: isinstance(v, str)),
    "json": ("JSON", lambda v: True),
}


def _declared(stage: contract.PipelineStage, value: Any) -> Any:
    """The stage's output if it is of the type the stage declares (a tenant's service may answer anything),
    and, for a label, one of its labels: what would choose no branch, or one its author never meant,
    fails the stage, named."""
    what, fits = SHAPES[stage["output"]]
    if not fits(value):
        raise StageFailed(stage["name"], 502, f"its answer is not {what}")
    labels = stage.get("labels")
    if labels is not None and value not in labels:
        raise StageFailed(stage["name"], 502, f"it answered {str(value)[:64]!r}, not one of its labels")
    return value


def _model_body(stage: contract.PipelineStage, inputs: dict[str, Any]) -> dict[str, Any]:
    """The engine request for a model stage's task (vLLM's OpenAI, rerank and classify APIs)."""
    task, model = stage["task"], stage["route"]
    if task == "rerank":
        documents = [d["text"] for d in inputs["documents"]]
        return {
            "model": model,
            "query": inputs["query"],
            "documents": documents,
            "top_n": stage.get("top_n", 0),
        }
    value = next(iter(inputs.values()))
    if task in ("embed", "classify"):
        return {"model": model, "input": value}
    body: dict[str, Any] = {"model": model, "max_tokens": stage.get("max_tokens", DEFAULT_MAX_TOKENS)}
    body["messages" if task == "chat" else "prompt"] = value
    return body


def _model_output(stage: contract.PipelineStage, inputs: dict[str, Any], answer: dict[str, Any]) -> Any:
    task = stage["task"]
    if task == "embed":
        return answer["data"][0]["embedding"]
    if task == "classify":
        return answer["data"][0]["label"]
    if task == "rerank":  # the documents as they came, best first, each with its new score
        documents = inputs["documents"]
        return [{**documents[r["index"]], "score": float(r["relevance_score"])} for r in answer["results"]]
    choice = answer["choices"][0]
    return choice["message"]["content"] if task == "chat" else choice["text"]


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return body[:300].decode("utf-8", "replace")


def _model_refusal(status: int, body: bytes) -> tuple[int, str, str]:
    """A model stage's failed request as the pipeline's answer (status, message, code). The tenant's own
    limits (the gateway's 429s, known by their code) stay a 429, so a client backs off instead of retrying
    a "bad gateway"; an input the model refuses (400: too long for its context, say; 413) is the client's
    400; anything else, a 422 of a body the gateway built included, is the stage's 502."""
    text = _error_text(body)
    try:
        code = json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    if status == 429 and code in (RATE_LIMITED, OVER_BUDGET):
        return 429, f"its model answered 429: {text}", code
    if status in (400, 413):
        return 400, f"its model refused its input: {text}", "invalid_request"
    return 502, f"its model answered {status}: {text}", "pipeline_stage_failed"


def _rendered(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, dict) and "text" in v for v in value):  # documents
        return "\n".join(f"[{n}] {v['text']}" for n, v in enumerate(value, 1))
    return json.dumps(value, ensure_ascii=False)


def _fill(stage: contract.PipelineStage, inputs: dict[str, Any]) -> list[dict[str, str]]:
    # The template's fields are exactly its inputs' names (checked at definition): values are inserted,
    # never parsed as templates themselves.
    content = stage["template"].format(**{name: _rendered(value) for name, value in inputs.items()})
    system = stage.get("system", "")
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": content}
    ]


def _redact(stage: contract.PipelineStage, value: Any) -> Any:
    """Every pattern replaced in text, or in every message's text (plain content and text parts). RE2:
    linear time whatever the pattern and the text; the replacement is literal."""
    patterns = [re2.compile(p) for p in stage["patterns"]]
    replacement = stage["replacement"]

    def clean(text: str) -> str:
        for pattern in patterns:
            text = pattern.sub(lambda _: replacement, text)
        return text

    def part(item: Any) -> Any:
        if isinstance(item, dict) and isinstance(item.get("text"), str):
            return {**item, "text": clean(item["text"])}
        return item

    def message(m: dict[str, Any]) -> dict[str, Any]:
        content = m.get("content")
        if isinstance(content, str):
            return {**m, "content": clean(content)}
        if isinstance(content, list):
            return {**m, "content": [part(item) for item in content]}
        return m

    return clean(value) if isinstance(value, str) else [message(m) for m in value]


async def _completion(send: Send, model: str, text: str, stream: bool) -> None:
    """An answer no engine streamed, in the shape a client asked for."""
    ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    if stream:
        chunk = {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
        }
        data = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
        content_type = b"text/event-stream"
    else:
        answer = {
            "id": ident,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ],
        }
        data, content_type = json.dumps(answer).encode(), b"application/json"
    headers = [(b"content-type", content_type), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})
