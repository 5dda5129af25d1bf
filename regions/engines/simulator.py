"""A small stand-in for vLLM's OpenAI-compatible server: same endpoints, same metric names.

For fast tests and for demo machines without the memory for real engines; the integration tests run the
real vLLM. It answers /health, /version, /v1/models, /v1/chat/completions and /v1/completions (plain and
streamed as server-sent events), /v1/embeddings, /v1/rerank, /classify and /metrics with the ``vllm:*``
series a router reads. Its reranker scores a document by the words it shares with the query; its
classifier answers the first word of the text as the label (so a test chooses the label it sends).
Tokens are counted roughly (4 characters each) and the text is random words. Time to first token is a
real ``vllm:time_to_first_token_seconds`` histogram with vLLM's buckets; ``--ttft-delay`` adds seconds
before every first token, to make one engine measurably slower than another.

    python -m regions.engines.simulator --model DIR --served-model-name NAME --port 8000 [vLLM flags...]
"""

import argparse
import hmac
import json
import os
import random
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

WORDS = ["the", "a", "model", "region", "token", "answer", "serve", "latency", "cluster", "weights", "cache"]
# vLLM's own bounds (vllm/v1/metrics/buckets.py), so that analyses read the simulator as they read vLLM.
TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
    *(20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)


class Histogram:
    """A Prometheus histogram: cumulative buckets by upper bound, then +Inf, a count and a sum."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds, self.counts, self.sum = bounds, [0] * (len(bounds) + 1), 0.0

    def observe(self, value: float) -> None:
        self.counts[next((i for i, le in enumerate(self.bounds) if value <= le), len(self.bounds))] += 1
        self.sum += value

    def lines(self, name: str, labels: str) -> list[str]:
        lines, total = [f"# TYPE {name} histogram"], 0
        for le, count in zip([*map(repr, self.bounds), "+Inf"], self.counts, strict=True):
            total += count
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {float(total)}')
        return [*lines, f"{name}_count{{{labels}}} {float(total)}", f"{name}_sum{{{labels}}} {self.sum}"]


class Engine:
    def __init__(self, name: str, max_model_len: int, ttft_delay: float = 0.0):
        self.name, self.max_model_len, self.ttft_delay = name, max_model_len, ttft_delay
        self.lock = threading.Lock()
        self.prompt_tokens = self.generation_tokens = self.requests_ok = self.running = 0
        self.ttft = Histogram(TTFT_BUCKETS)

    def metrics(self) -> str:
        labels = f'engine="0",model_name="{self.name}"'
        series = [
            ("vllm:num_requests_running", "gauge", self.running),
            ("vllm:num_requests_waiting", "gauge", 0),
            ("vllm:kv_cache_usage_perc", "gauge", min(1.0, self.running * 0.05)),
            ("vllm:prompt_tokens_total", "counter", self.prompt_tokens),
            ("vllm:generation_tokens_total", "counter", self.generation_tokens),
        ]
        lines = []
        for name, kind, value in series:
            lines += [f"# TYPE {name} {kind}", f"{name}{{{labels}}} {float(value)}"]
        lines += [
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{labels},finished_reason="length"}} {float(self.requests_ok)}',
        ]
        with self.lock:
            lines += self.ttft.lines("vllm:time_to_first_token_seconds", labels)
        return "\n".join(lines) + "\n"

    def first_token(self, arrived: float) -> None:
        """Wait out ``--ttft-delay``, then record the time from the request's arrival to its first token."""
        time.sleep(self.ttft_delay)
        with self.lock:
            self.ttft.observe(time.monotonic() - arrived)

    def count(self, prompt: int, completion: int) -> None:
        with self.lock:
            self.prompt_tokens += prompt
            self.generation_tokens += completion
            self.requests_ok += 1


def _prompt_tokens(body: dict[str, Any]) -> int:
    text = body.get("prompt") or " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    return max(1, len(str(text)) // 4)


def _refusal(body: Any, path: str, max_model_len: int) -> str | None:
    """Why vLLM would answer 400 (its request validation), or None: a malformed body is a client error,
    never a dropped connection, and no ``max_tokens`` may make the engine build an unbounded answer."""
    if not isinstance(body, dict):
        return "The request body must be a JSON object."
    if path not in {"/v1/chat/completions", "/v1/completions"}:
        return None
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return "'messages' must be a list of message objects."
    elif not isinstance(body.get("prompt", ""), str | list):
        return "'prompt' must be a string or a list."
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        return None
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return f"max_tokens must be an integer of at least 1, got {max_tokens!r}."
    requested = _prompt_tokens(body) + max_tokens
    if requested > max_model_len:
        return (
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{requested} tokens ({requested - max_tokens} in the messages, {max_tokens} in the completion)."
        )
    return None


class Handler(BaseHTTPRequestHandler):
    engine: Engine
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _unauthorized(self) -> bool:
        """As vLLM: with VLLM_API_KEY set, every /v1 path wants it as a bearer token (401 otherwise)."""
        key = os.environ.get("VLLM_API_KEY", "")
        if not key or not self.path.startswith("/v1"):
            return False
        sent = self.headers.get("Authorization", "")
        if hmac.compare_digest(sent.encode(), f"Bearer {key}".encode()):
            return False
        self._json(401, {"error": "Unauthorized"})
        return True

    def do_GET(self) -> None:
        if self._unauthorized():
            return
        if self.path == "/health":
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif self.path == "/version":
            self._json(200, {"version": "simulator"})
        elif self.path == "/v1/models":
            card = {
                "id": self.engine.name,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "vllm",
                "root": self.engine.name,
                "max_model_len": self.engine.max_model_len,
            }
            self._json(200, {"object": "list", "data": [card]})
        elif self.path == "/metrics":
            data = self.engine.metrics().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        else:
            self._json(404, {"error": {"message": "Not Found", "type": "NotFoundError", "code": 404}})

    def do_POST(self) -> None:
        arrived = time.monotonic()
        raw = self.rfile.read(
            int(self.headers.get("Content-Length", 0))
        )  # read first: the connection lives on
        if self._unauthorized():
            return None
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self._json(
                400, {"error": {"message": "invalid JSON", "type": "BadRequestError", "code": 400}}
            )
        if refused := _refusal(body, self.path, self.engine.max_model_len):
            return self._json(400, {"error": {"message": refused, "type": "BadRequestError", "code": 400}})
        if body.get("model") not in (None, self.engine.name):
            message = f"The model `{body.get('model')}` does not exist."
            return self._json(404, {"error": {"message": message, "type": "NotFoundError", "code": 404}})
        if self.path == "/v1/embeddings":
            return self._embeddings(body)
        if self.path == "/v1/rerank":
            return self._rerank(body)
        if self.path == "/classify":
            return self._classify(body)
        if self.path not in {"/v1/chat/completions", "/v1/completions"}:
            return self._json(404, {"error": {"message": "Not Found", "type": "NotFoundError", "code": 404}})
        chat = self.path == "/v1/chat/completions"
        prompt, completion = _prompt_tokens(body), int(body.get("max_tokens") or 16)
        with self.engine.lock:
            self.engine.running += 1
        try:
            if body.get("stream"):
                self._stream(body, chat, prompt, completion, arrived)
            else:
                self._complete(chat, prompt, completion, arrived)
        finally:
            with self.engine.lock:
                self.engine.running -= 1
        self.engine.count(prompt, completion)
        return None

    def _usage(self, prompt: int, completion: int) -> dict[str, int]:
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _complete(self, chat: bool, prompt: int, completion: int, arrived: float) -> None:
        self.engine.first_token(arrived)
        text = " ".join(random.choice(WORDS) for _ in range(completion))
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": text}} if chat else {"text": text})
        self._json(
            200,
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": self.engine.name,
                "choices": [choice],
                "usage": self._usage(prompt, completion),
            },
        )

    def _stream(self, body: dict[str, Any], chat: bool, prompt: int, completion: int, arrived: float) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        rid = f"cmpl-{uuid.uuid4().hex}"

        def send(payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        for n in range(completion):
            if n == 0:
                self.engine.first_token(arrived)
            piece = random.choice(WORDS) + " "
            delta = {"delta": {"content": piece}} if chat else {"text": piece}
            finish = "length" if n == completion - 1 else None
            send(
                json.dumps(
                    {
                        "id": rid,
                        "object": "chat.completion.chunk" if chat else "text_completion",
                        "model": self.engine.name,
                        "choices": [{"index": 0, **delta, "finish_reason": finish}],
                    }
                )
            )
            time.sleep(0.002)
        if (body.get("stream_options") or {}).get("include_usage"):
            send(
                json.dumps(
                    {
                        "id": rid,
                        "model": self.engine.name,
                        "choices": [],
                        "usage": self._usage(prompt, completion),
                    }
                )
            )
        send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def _embeddings(self, body: dict[str, Any]) -> None:
        inputs = body.get("input") or [""]
        inputs = inputs if isinstance(inputs, list) else [inputs]
        data = [
            {"object": "embedding", "index": i, "embedding": [random.random() for _ in range(8)]}
            for i in range(len(inputs))
        ]
        tokens = sum(max(1, len(str(x)) // 4) for x in inputs)
        self.engine.count(tokens, 0)
        self._json(
            200,
            {
                "object": "list",
                "data": data,
                "model": self.engine.name,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    def _pooled(self, tokens: int, answer: dict[str, Any]) -> None:
        self.engine.count(tokens, 0)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        self._json(200, {"model": self.engine.name, **answer, "usage": usage})

    def _rerank(self, body: dict[str, Any]) -> None:
        query, documents = _words(body.get("query")), body.get("documents") or []
        if not isinstance(documents, list):
            documents = [documents]
        ranked = sorted(enumerate(documents), key=lambda item: -_overlap(query, _words(item[1])))
        scored = [
            {"index": i, "document": {"text": str(d)}, "relevance_score": _overlap(query, _words(d))}
            for i, d in ranked
        ]
        top_n = body.get("top_n") or len(scored)
        tokens = sum(max(1, len(str(x)) // 4) for x in [body.get("query"), *documents])
        self._pooled(tokens, {"id": f"rerank-{uuid.uuid4().hex}", "results": scored[:top_n]})

    def _classify(self, body: dict[str, Any]) -> None:
        inputs = body.get("input") or [""]
        inputs = inputs if isinstance(inputs, list) else [inputs]
        data = [
            {"index": i, "label": (_words(x) or ["none"])[0], "probs": [1.0], "num_classes": 1}
            for i, x in enumerate(inputs)
        ]
        tokens = sum(max(1, len(str(x)) // 4) for x in inputs)
        self._pooled(tokens, {"id": f"classify-{uuid.uuid4().hex}", "object": "list", "data": data})


def _words(text: Any) -> list[str]:
    return [w.strip(".,;:!?\"'()").lower() for w in str(text or "").split() if w.strip(".,;:!?\"'()")]


def _overlap(query: list[str], document: list[str]) -> float:
    """Jaccard similarity of the two texts' words: 1.0 for the same words, 0.0 for none shared."""
    union = set(query) | set(document)
    return round(len(set(query) & set(document)) / len(union), 4) if union else 0.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True)
    parser.add_argument("--served-model-name", nargs="+")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--startup-delay", type=float, default=0.0, help="seconds of pretend weight loading")
    parser.add_argument(
        "--ttft-delay", type=float, default=0.0, help="seconds added before every first token"
    )
    args, _ = parser.parse_known_args(argv)  # every other vLLM flag is accepted and ignored
    time.sleep(args.startup_delay)  # like vLLM, the port is not listening while "loading"
    name = (args.served_model_name or [args.model])[0]
    Handler.engine = Engine(name, args.max_model_len, ttft_delay=args.ttft_delay)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"simulated engine serving {Handler.engine.name} on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
