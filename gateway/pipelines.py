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
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from gateway import contract
from gateway.retrieval import Indexes

# How a model stage's task is asked of an engine, and what of its answer flows on.
TASK_PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions", "embed": "/v1/embeddings"}
DEFAULT_MAX_TOKENS = 256  # a stage before the answer that sets none
Send = Callable[[dict[str, Any]], Awaitable[None]]
# ((pipeline version, stage), path, body, send) → the status, and the body when ``send`` is None (the
# stage's answer is kept)
Call = Callable[[tuple[str, str], str, dict[str, Any], Send | None], Awaitable[tuple[int, bytes]]]


class StageFailed(Exception):
    def __init__(self, stage: str, status: int, message: str, code: str = "pipeline_stage_failed"):
        super().__init__(message)
        self.stage, self.status, self.message, self.code = stage, status, message, code


def last_user_text(messages: Any) -> str:
    """``request.query``: the content of the last user message (text parts joined)."""
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
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
        clock: Callable[[], float] = time.monotonic,
    ):
        self.name, self.route, self.payload, self.call = name, route, payload, call
        self.session, self.tenant, self.indexes, self.clock = session, tenant, indexes, clock
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
            pending = [s for s in pending if s not in ready]
            await asyncio.gather(*(self._stage(s) for s in ready))
        chosen = [s for s in answer if self._holds(s)]
        if len(chosen) != 1:  # the registry refuses graphs where this could happen
            raise StageFailed(self.route["output"][0], 500, "no answering stage's condition held")
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
        try:
            self.values[name] = await asyncio.wait_for(self._work(stage), timeout)
            outcome = "ok"
        except (TimeoutError, StageFailed, aiohttp.ClientError, ValueError, KeyError, TypeError) as exc:
            if stage["on_failure"] != "skip":
                raise _failure(stage, exc, timeout) from None
            self.values[name], outcome = self.values[stage["passes"]], "skipped"
        finally:
            self.took[name] = (outcome, self.clock() - started)

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
        tag = (self.route["version"], stage["name"])
        status, body = await self.call(tag, TASK_PATHS[stage["task"]], self._model_body(stage, inputs), None)
        if status != 200:
            raise StageFailed(stage["name"], 502, f"its model answered {status}: {_error_text(body)}")
        return _model_output(stage["task"], json.loads(body))

    def _model_body(self, stage: contract.PipelineStage, inputs: dict[str, Any]) -> dict[str, Any]:
        value = next(iter(inputs.values()))
        task, model = stage["task"], stage["route"]
        if task == "embed":
            return {"model": model, "input": value}
        body: dict[str, Any] = {"model": model, "max_tokens": stage.get("max_tokens", DEFAULT_MAX_TOKENS)}
        body["messages" if task == "chat" else "prompt"] = value
        return body

    async def _http(self, stage: contract.PipelineStage, inputs: dict[str, Any]) -> Any:
        """A tenant's own service: POST {"inputs": {...}}, answered {"output": ...}."""
        async with self.session.post(stage["url"], json={"inputs": inputs}) as answered:
            if answered.status != 200:
                raise StageFailed(stage["name"], 502, f"its service answered {answered.status}")
            return (await answered.json(content_type=None))["output"]

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

            started, timeout = self.clock(), self._timeout(stage)
            tag = (self.route["version"], stage["name"])
            task = asyncio.ensure_future(self.call(tag, TASK_PATHS["chat"], body, relay))
            try:
                await asyncio.wait_for(asyncio.shield(first.wait()), timeout)
            except TimeoutError:
                if not first.is_set():
                    task.cancel()
                    self.took[stage["name"]] = ("failed", self.clock() - started)
                    raise _failure(stage, TimeoutError(), timeout) from None
            status, _ = await task
            self.took[stage["name"]] = ("ok" if status == 200 else "failed", self.clock() - started)
            return
        await self._stage(stage)
        self.answering = True
        await _completion(send, self.name, str(self.values[stage["name"]]), bool(self.payload.get("stream")))


def _failure(stage: contract.PipelineStage, exc: BaseException, timeout: float) -> StageFailed:
    if isinstance(exc, StageFailed):
        return exc
    if isinstance(exc, TimeoutError):
        return StageFailed(
            stage["name"], 504, f"it took longer than {timeout * 1000:.0f} ms", "pipeline_timeout"
        )
    return StageFailed(stage["name"], 502, f"{type(exc).__name__}: {exc}"[:300])


def _error_text(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return body[:300].decode("utf-8", "replace")


def _model_output(task: str, answer: dict[str, Any]) -> Any:
    if task == "embed":
        return answer["data"][0]["embedding"]
    choice = answer["choices"][0]
    return choice["message"]["content"] if task == "chat" else choice["text"]


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
    patterns = [re.compile(p) for p in stage["patterns"]]

    def clean(text: str) -> str:
        for pattern in patterns:
            text = pattern.sub(stage["replacement"], text)
        return text

    if isinstance(value, str):
        return clean(value)
    return [{**m, "content": clean(m["content"])} if isinstance(m.get("content"), str) else m for m in value]


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
