"""Prefix-aware routing on real vLLM: the engines' prefix-cache hit rate and time to first token with the
gateway's prefix routing on, against the plain weighted balancer, in one run.

Two real vLLM engines (CPU build) serve the project's tiny generated model (its byte-level tokenizer: one
token per character), behind two gateway processes reading one route table from a stub control plane:
one with prefix routing (the default), one with ``GATEWAY_PREFIX_ROUTING=0``. The workload: groups of
requests sharing a long system prompt (one per group, ``--prompt-chars`` characters, as an application's
instructions are), each with its own question, sent in an interleaved order by ``--clients`` clients,
streamed, a few tokens each. Each side gets prompts of its own (the other side's are never cached) and
the engines' prefix caches are emptied before it (``/reset_prefix_cache``, vLLM's dev mode). Read from
the engines' own counters: ``vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`` (tokens)
over the side's requests, and from the clients: time to first token (the stream's first event).

    .venv/bin/python bench/prefix_routing_bench.py [--groups 8] [--per-group 8] [--clients 2]
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests
from gateway_bench import STUB_CONTROL_PLANE, TOKEN, free_port, gateway_table, wait_port

from regions.engines.tiny_model import write_tiny_model

ROOT = Path(__file__).resolve().parents[1]

WORDS = [
    "region",
    "model",
    "tenant",
    "budget",
    "engine",
    "cache",
    "prefix",
    "route",
    "canary",
    "rollout",
    "weights",
    "audit",
    "policy",
]


def engine(model: Path, port: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",  # /reset_prefix_cache between the sides
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "OMP_NUM_THREADS": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    command += ["--served-model-name", "chat", "--port", str(port), "--load-format", "dummy"]
    command += ["--dtype", "float32", "--max-model-len", "2048", "--enable-prefix-caching"]
    return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def counters(port: int) -> dict[str, float]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found = {"queries": 0.0, "hits": 0.0}
    for line in text.splitlines():
        for name in found:
            if line.startswith(f"vllm:prefix_cache_{name}_total"):
                found[name] += float(line.rsplit(" ", 1)[1])
    return found


def workload(seed: str, groups: int, per_group: int, chars: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    systems = []
    for _ in range(groups):
        text = ""
        while len(text) < chars:
            text += rng.choice(WORDS) + " "
        systems.append(text[:chars])
    requests_ = [
        [{"role": "system", "content": system}, {"role": "user", "content": f"question {n} {rng.random()}"}]
        for system in systems
        for n in range(per_group)
    ]
    rng.shuffle(requests_)
    return requests_


def run_side(gateway: int, messages: list[list[dict[str, str]]], clients: int) -> list[float]:
    ttfts: list[float] = []
    queue = list(messages)
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not queue:
                    return
                item = queue.pop()
            body = {"model": "chat", "messages": item, "max_tokens": 4, "stream": True}
            sent = time.perf_counter()
            headers = {"Authorization": f"Bearer {TOKEN}"}
            url = f"http://127.0.0.1:{gateway}/v1/chat/completions"
            with requests.post(url, json=body, headers=headers, stream=True, timeout=300) as reply:
                reply.raise_for_status()
                first = None
                for line in reply.iter_lines():
                    if line.startswith(b"data: ") and first is None:
                        first = time.perf_counter() - sent
                with lock:
                    ttfts.append(first or 0.0)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return ttfts


def table(ports: list[int]) -> dict[str, object]:
    config = gateway_table(ports[0])
    tenant = config["table"]["tenants"]["bench"]  # type: ignore[index]
    first = tenant["models"]["chat"]["endpoints"][0]
    tenant["models"]["chat"]["endpoints"] = [{**first, "url": f"http://127.0.0.1:{p}"} for p in ports]
    return config


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--per-group", type=int, default=8)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--prompt-chars", type=int, default=1200)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="prefix-bench-"))
    model = write_tiny_model(folder / "tiny")
    ports = [free_port(), free_port()]
    control = free_port()
    procs = [engine(model, port) for port in ports]
    procs.append(
        subprocess.Popen([sys.executable, "-c", STUB_CONTROL_PLANE, str(control), json.dumps(table(ports))])
    )
    sides = {"prefix routing": "1", "weighted balancer": "0"}
    gateways = {}
    try:
        for port in ports:
            wait_port(port, timeout=600)
            while requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code != 200:
                time.sleep(1)
        for name, switch in sides.items():
            gateways[name] = free_port()
            env = {**os.environ, "CONTROL_PLANE_URL": f"http://127.0.0.1:{control}", "GATEWAY_TOKEN": "bench"}
            env |= {"GATEWAY_PREFIX_ROUTING": switch, "GATEWAY_STATE_DIR": str(folder / f"state-{switch}")}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gateway", "--port", str(gateways[name])],
                    env=env,
                    cwd=ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            wait_port(gateways[name])
        time.sleep(2)  # the route table fetched
        warm = workload("warm", 2, 4, args.prompt_chars)
        run_side(gateways["weighted balancer"], warm, args.clients)  # first batches of each shape
        results = {}
        for name in sides:
            for port in ports:
                requests.post(f"http://127.0.0.1:{port}/reset_prefix_cache", timeout=30)
            before = [counters(p) for p in ports]
            ttfts = run_side(
                gateways[name], workload(name, args.groups, args.per_group, args.prompt_chars), args.clients
            )
            after = [counters(p) for p in ports]
            queries = sum(a["queries"] - b["queries"] for a, b in zip(after, before, strict=True))
            hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before, strict=True))
            results[name] = (hits / queries if queries else 0.0, ttfts)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=60)
    total = args.groups * args.per_group
    print(
        f"\n{total} requests per side: {args.groups} system prompts of {args.prompt_chars} characters, "
        f"{args.per_group} questions each, {args.clients} clients, 2 engines"
    )
    print(f"{'side':<20} {'prefix hit rate':>16} {'TTFT p50':>10} {'TTFT p95':>10}")
    for name, (rate, ttfts) in results.items():
        p95 = statistics.quantiles(ttfts, n=20)[-1]
        print(f"{name:<20} {rate:>15.1%} {statistics.median(ttfts) * 1e3:>8.1f}ms {p95 * 1e3:>8.1f}ms")


if __name__ == "__main__":
    main()
