"""Pipeline overhead: what the gateway adds per stage over calling the same stages directly in sequence.

One process, one loop, concurrency 1. The stages are ``http`` stages against one local service (a
threaded HTTP server answering ``{"output": …}`` at once), so what is measured is the gateway's work per
stage: scheduling, the timeout, the network check on the service's address, JSON in and out, metrics.

- direct: K sequential POSTs to the service with one aiohttp session (the floor: what a client calling
  the stages itself would spend);
- pipeline: one chat completion to the gateway (in-process ASGI call) whose pipeline chains K http stages,
  the last one answering; includes the gateway's own request handling (authentication, the route table).

Per-stage overhead = (pipeline − direct) / K, from medians, for K = 1, 4 and 16; p50 and p99 of each.

    .venv/bin/python bench/pipeline_bench.py [--requests 400]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.gateway_harness import GatewayWorld, Service  # noqa: E402


def chain(service: Service, stages: int) -> dict[str, Any]:
    """K http stages, each taking the previous one's text; the last answers."""
    built = []
    for n in range(stages):
        source = "request.query" if n == 0 else f"s{n - 1}"
        built.append(
            {
                "name": f"s{n}",
                "kind": "http",
                "inputs": {"input": source},
                "output": "text",
                "timeout_ms": None,
                "on_failure": "fail",
                "url": service.url,
                "jurisdiction": "EU",
            }
        )
    return {"version": "acme/bench@1", "budget_ms": 60_000, "output": [f"s{stages - 1}"], "stages": built}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def direct(session: aiohttp.ClientSession, url: str, stages: int) -> float:
    started = time.perf_counter()
    text = "what is the refund window?"
    for _ in range(stages):
        async with session.post(url, json={"inputs": {"input": text}}) as answer:
            text = (await answer.json())["output"]
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    args = parser.parse_args()
    service = Service(lambda inputs: inputs["input"])
    with tempfile.TemporaryDirectory() as folder:
        world = GatewayWorld(Path(folder))
        try:
            print(f"{'stages':>6} {'side':<9} {'p50 ms':>8} {'p99 ms':>8}")
            for stages in (1, 4, 16):
                world.gateway.routes.body["tenants"]["acme"]["pipelines"] = {"bench": chain(service, stages)}
                medians = {}
                for side in ("direct", "pipeline"):
                    took = []
                    for _ in range(args.requests // 10):  # warm up
                        _one(world, side, service, stages)
                    for _ in range(args.requests):
                        took.append(_one(world, side, service, stages))
                    medians[side] = statistics.median(took)
                    print(f"{stages:>6} {side:<9} {medians[side]:>8.3f} {percentile(took, 0.99):>8.3f}")
                per_stage = (medians["pipeline"] - medians["direct"]) / stages
                print(f"{stages:>6} overhead per stage: {per_stage:.3f} ms")
        finally:
            world.close()
            service.close()


def _one(world: GatewayWorld, side: str, service: Service, stages: int) -> float:
    if side == "direct":
        return float(world.run(direct(world.gateway.session, service.url, stages)))  # type: ignore[arg-type]
    started = time.perf_counter()
    answer = world.chat(model="bench", messages=[{"role": "user", "content": "what is the refund window?"}])
    assert answer.status == 200, answer.body
    return (time.perf_counter() - started) * 1000


if __name__ == "__main__":
    main()
