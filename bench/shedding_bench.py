"""Load shedding under overload: the p99 latency of interactive requests when the offered load is twice
what the engine can serve, with the gateway shedding batch requests and without, in one run.

The engine is a small aiohttp server that serves ``--capacity`` requests at a time, ``--service-ms`` each,
and queues the rest (as vLLM queues past ``max_num_seqs``). Two gateway processes read one route table
from a stub control plane: one sheds (``GATEWAY_MAX_IN_FLIGHT_PER_ENDPOINT`` = the engine's capacity, so
the gateway knows the engine is full without waiting for the router's next probe), one does not. Two
tokens: an interactive one and a batch one. Open-loop clients send interactive and batch requests at a
fixed rate each (together twice the engine's capacity) for ``--seconds``; every answer's latency is
kept by class.

    .venv/bin/python bench/shedding_bench.py [--capacity 8] [--service-ms 50] [--seconds 15]
"""

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from gateway_bench import STUB_CONTROL_PLANE, TOKEN, free_port, gateway_table, wait_port

ROOT = Path(__file__).resolve().parents[1]
BATCH_TOKEN = "sk-batch-" + "y" * 48
ENGINE = """
import asyncio, sys
from aiohttp import web
slots = asyncio.Semaphore(int(sys.argv[2]))
service = float(sys.argv[3]) / 1000
async def answer(request):
    await request.read()
    async with slots:
        await asyncio.sleep(service)
    usage = {"prompt_tokens": 5, "completion_tokens": 5}
    return web.json_response({"choices": [{"index": 0}], "usage": usage})
app = web.Application()
app.router.add_post("/v1/chat/completions", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def table(engine: int) -> dict[str, object]:
    config = gateway_table(engine)
    credentials = config["table"]["credentials"]  # type: ignore[index]
    batch = dict(next(iter(credentials.values())), priority="batch", token="batch000")
    credentials[hashlib.sha256(BATCH_TOKEN.encode()).hexdigest()] = batch
    return config


async def offer(port: int, token: str, rate: float, seconds: float, out: list[tuple[int, float]]) -> None:
    """Open loop: a request every 1/rate s whatever the answers do, each timed to its end."""
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {token}"}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one() -> None:
            sent = time.perf_counter()
            async with session.post(url, json=body, headers=headers) as reply:
                await reply.read()
                out.append((reply.status, time.perf_counter() - sent))

        tasks, start = [], time.perf_counter()
        for n in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)


def side(port: int, rate: float, seconds: float) -> dict[str, list[tuple[int, float]]]:
    found: dict[str, list[tuple[int, float]]] = {"interactive": [], "batch": []}

    async def both() -> None:
        await asyncio.gather(
            offer(port, TOKEN, rate, seconds, found["interactive"]),
            offer(port, BATCH_TOKEN, rate, seconds, found["batch"]),
        )

    asyncio.run(both())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--service-ms", type=float, default=50)
    parser.add_argument("--seconds", type=float, default=15)
    args = parser.parse_args()
    capacity_rps = args.capacity * 1000 / args.service_ms
    rate = capacity_rps  # per class: two classes offer twice the capacity
    folder = Path(tempfile.mkdtemp(prefix="shedding-bench-"))
    engine, control = free_port(), free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ENGINE, str(engine), str(args.capacity), str(args.service_ms)]
        ),
        subprocess.Popen([sys.executable, "-c", STUB_CONTROL_PLANE, str(control), json.dumps(table(engine))]),
    ]
    results = {}
    try:
        wait_port(engine), wait_port(control)
        for name, cap in (("no shedding", 0), ("shedding batch", args.capacity)):
            port = free_port()
            env = {**os.environ, "CONTROL_PLANE_URL": f"http://127.0.0.1:{control}", "GATEWAY_TOKEN": "bench"}
            env |= {"GATEWAY_MAX_IN_FLIGHT_PER_ENDPOINT": str(cap), "GATEWAY_STATE_DIR": str(folder / name)}
            gateway = subprocess.Popen(
                [sys.executable, "-m", "gateway", "--port", str(port)],
                env=env,
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wait_port(port)
            time.sleep(2)  # the route table fetched
            results[name] = side(port, rate, args.seconds)
            gateway.terminate()
            gateway.wait(timeout=30)
    finally:
        for proc in procs:
            proc.terminate()
    print(
        f"\nengine: {args.capacity} at a time, {args.service_ms:.0f} ms each ({capacity_rps:.0f} req/s); "
        f"offered {rate:.0f} interactive + {rate:.0f} batch req/s for {args.seconds:.0f} s"
    )
    print(f"{'side':<16} {'class':<12} {'served':>7} {'shed':>6} {'p50':>9} {'p99':>9}")
    for name, classes in results.items():
        for kind, answers in classes.items():
            ok = sorted(latency for status, latency in answers if status == 200)
            shed = sum(1 for status, _ in answers if status == 503)
            p99 = statistics.quantiles(ok, n=100)[-1] if len(ok) > 1 else float("nan")
            p50 = statistics.median(ok) if ok else float("nan")
            print(f"{name:<16} {kind:<12} {len(ok):>7} {shed:>6} {p50 * 1e3:>7.0f}ms {p99 * 1e3:>7.0f}ms")


if __name__ == "__main__":
    main()
