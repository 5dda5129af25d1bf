"""What a rollout costs at the gateway: the weighted split and the shadow mirror against today's route.

Two fast fake engines (aiohttp answering a fixed chat completion, one process each: the stable revision
and the candidate) sit behind `python -m gateway`, whose table (from a stub control plane) gives one tenant
three model names on the same engines:

- (a) ``plain``: the stable revision only (today's route, no ``splits``);
- (b) ``canary``: stable + candidate with a 25 % split;
- (c) ``shadow``: stable + candidate with a 25 % split and a 10 % mirror;
- and, to tell the split's own cost from that of a second engine: ``idle``, stable + candidate with a
  0 % split (the hashing, no request ever goes to the candidate).

With ``--baseline CHECKOUT`` (a checkout of the code before rollouts, e.g. ``main``), a second gateway
from that checkout serves ``plain`` too: today's gateway itself, to see what this code adds without splits.

One client at a time (concurrency 1, keep-alive) calls the stable engine directly and the gateway for
(a), (b) and (c), interleaved in rounds so that drift on a shared machine hits every side alike. Printed:
median and p95 latency, what the gateway adds over calling the engine directly, and (b)−(a), (c)−(a).
Then, in-process, the cost of choosing an endpoint (tier, revision, engine) and a mirror target alone.

    .venv/bin/python bench/rollout_gateway_bench.py [--requests 3000] [--round 100] [--baseline ../main]
"""

import argparse
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_bench import ANSWER, STUB_CONTROL_PLANE, TOKEN, free_port, gateway_table, wait_port

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from gateway import contract  # noqa: E402
from gateway.app import Gateway  # noqa: E402
from gateway.balancer import mirror_target  # noqa: E402
from gateway.config import Settings  # noqa: E402

FAKE_ENGINE = """
import json, sys
from aiohttp import web
answer = json.dumps(json.loads(sys.argv[2])).encode()
async def chat(request):
    await request.read()
    return web.Response(body=answer, content_type="application/json")
app = web.Application()
app.router.add_post("/v1/chat/completions", chat)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""
SIDES = ("direct (engine)", "(a) no split", "(b) 25 % canary", "(c) 25 % + 10 % mirror", "0 % split")
TODAY = "today's gateway, plain"
MODELS = {SIDES[1]: "plain", SIDES[2]: "canary", SIDES[3]: "shadow", SIDES[4]: "idle"}


def rollout_table(stable: int, candidate: int) -> dict[str, object]:
    table = gateway_table(stable)
    (base,) = table["table"]["tenants"]["bench"]["models"]["chat"]["endpoints"]  # type: ignore[index]
    models = {"plain": {"endpoints": [{**base, "track": contract.STABLE}], "preferred": "local-1"}}
    splits = {"canary": (25, 0), "shadow": (25, 10), "idle": (0, 0)}
    for name, (weight, mirror) in splits.items():
        split = {"candidate": weight, "mirror": mirror}
        shadow = {
            **base,
            "url": f"http://127.0.0.1:{candidate}",
            "version": "bench@2.0.0",
            "track": contract.CANDIDATE,
        }
        models[name] = {
            "endpoints": [{**base, "track": contract.STABLE}, shadow],
            "preferred": "local-1",
            "splits": {"local-1": split},
        }
    table["table"]["tenants"]["bench"]["models"] = models  # type: ignore[index]
    return table


class Caller:
    """One keep-alive connection, one request at a time."""

    def __init__(self, port: int):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)

    def call(self, model: str) -> tuple[float, dict[str, str]]:
        body = json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
        )
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
        began = time.perf_counter()
        self.connection.request("POST", "/v1/chat/completions", body, headers)
        reply = self.connection.getresponse()
        reply.read()
        took = (time.perf_counter() - began) * 1e3
        if reply.status != 200:
            raise RuntimeError(f"{model}: {reply.status}")
        return took, {k.lower(): v for k, v in reply.getheaders()}


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


def run_rounds(callers: dict[str, Caller], requests: int, size: int) -> tuple[dict[str, list[float]], int]:
    samples: dict[str, list[float]] = {side: [] for side in callers}
    candidate = 0
    for _ in range(requests // size):
        for side, caller in callers.items():
            for _ in range(size):
                took, headers = caller.call(MODELS.get(side, "chat"))
                samples[side].append(took)
                candidate += side == SIDES[2] and headers.get("x-model-version") == "bench@2.0.0"
    return samples, candidate


def choice_cost(table: dict[str, object]) -> dict[str, float]:
    """Microseconds per call of the gateway's endpoint choice and mirror decision, in this process."""
    gateway = Gateway(
        Settings(
            control_plane="http://127.0.0.1:9", token="", cache_file=None, state_dir=Path(tempfile.mkdtemp())
        )
    )
    models = table["table"]["tenants"]["bench"]["models"]  # type: ignore[index]
    number = 20_000
    cost = {}
    for name in ("plain", "canary", "shadow", "idle"):
        route = models[name]
        seconds = timeit.timeit(
            lambda route=route: gateway.decide.choose(route, set(), os.urandom(16).hex(), None, None, []),
            number=number,
        )
        cost[f"choose ({name})"] = seconds / number * 1e6
    served = models["shadow"]["endpoints"][0]
    seconds = timeit.timeit(
        lambda: mirror_target(models["shadow"], served, os.urandom(16).hex()), number=number
    )
    cost["mirror_target (shadow)"] = seconds / number * 1e6
    seconds = timeit.timeit(lambda: os.urandom(16).hex(), number=number)
    cost["(the random id alone)"] = seconds / number * 1e6
    return cost


def gateway_metrics(port: int) -> dict[str, float]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    return {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith(("gateway_mirrors_", "gateway_rollout_"))
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=3000, help="per side")
    parser.add_argument("--round", type=int, default=100, help="requests per side per round")
    parser.add_argument("--baseline", type=Path, help="a checkout whose gateway is measured on `plain` too")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="rollout-bench-"))
    stable, candidate, control, port = free_port(), free_port(), free_port(), free_port()
    table = rollout_table(stable, candidate)
    procs: list[subprocess.Popen[bytes]] = []

    def start(cmd: list[str], **env: str) -> None:
        procs.append(
            subprocess.Popen(
                cmd, env={**os.environ, **env}, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        )

    try:
        for engine_port in (stable, candidate):
            start([sys.executable, "-c", FAKE_ENGINE, str(engine_port), json.dumps(ANSWER)])
        start([sys.executable, "-c", STUB_CONTROL_PLANE, str(control), json.dumps(table)])
        for each in (stable, candidate, control):
            wait_port(each)
        start(
            [sys.executable, "-m", "gateway", "--port", str(port)],
            CONTROL_PLANE_URL=f"http://127.0.0.1:{control}",
            GATEWAY_TOKEN="bench",
            GATEWAY_STATE_DIR=str(folder),
            GATEWAY_CACHE_FILE=str(folder / "routes.json"),
        )
        wait_port(port)
        callers = {SIDES[0]: Caller(stable), **{side: Caller(port) for side in SIDES[1:]}}
        if args.baseline:
            today = free_port()
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "gateway", "--port", str(today)],
                    env={
                        **os.environ,
                        "PYTHONPATH": str(args.baseline.resolve()),
                        "CONTROL_PLANE_URL": f"http://127.0.0.1:{control}",
                        "GATEWAY_TOKEN": "bench",
                        "GATEWAY_STATE_DIR": str(folder / "today"),
                        "GATEWAY_CACHE_FILE": str(folder / "today-routes.json"),
                    },
                    cwd=args.baseline,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            wait_port(today)
            callers[TODAY] = Caller(today)
            MODELS[TODAY] = "plain"
        time.sleep(2)  # the route tables fetched
        run_rounds(callers, 4 * args.round, args.round)  # warm up: connections, caches
        began = time.monotonic()
        samples, candidate_answers = run_rounds(callers, args.requests, args.round)
        wall = time.monotonic() - began
        time.sleep(1)  # the last copies finish
        metrics = gateway_metrics(port)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)

    direct = samples[SIDES[0]]
    floor_median, floor_p95 = statistics.median(direct), p95(direct)
    print(
        f"\n{len(direct)} requests per side at concurrency 1, {wall:.0f} s, "
        f"interleaved in rounds of {args.round}\n"
    )
    print(f"{'side':<26} {'median':>9} {'p95':>9} {'added median':>13} {'added p95':>10}")
    for side in samples:
        median, high = statistics.median(samples[side]), p95(samples[side])
        print(
            f"{side:<26} {median:>7.3f}ms {high:>7.3f}ms "
            f"{median - floor_median:>11.3f}ms {high - floor_p95:>8.3f}ms"
        )
    a = samples[SIDES[1]]
    for side in [*SIDES[2:], *([TODAY] if TODAY in samples else [])]:
        b = samples[side]
        print(
            f"{side} − (a): median {statistics.median(b) - statistics.median(a):+.3f} ms, "
            f"p95 {p95(b) - p95(a):+.3f} ms"
        )
    print(
        f"\ncanary answers from the candidate: {candidate_answers / len(samples[SIDES[2]]):.1%} (split 25 %)"
    )
    print("gateway counters:", ", ".join(f"{k} {v:.0f}" for k, v in sorted(metrics.items())))
    print("\nin-process cost per call:")
    for name, micros in choice_cost(table).items():
        print(f"  {name:<26} {micros:6.2f} µs")


if __name__ == "__main__":
    main()
