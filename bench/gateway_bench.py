"""Gateway overhead: our gateway against nginx as a reverse proxy and LiteLLM's proxy, one run, one machine.

Every side forwards the same OpenAI chat-completion request to the same fast upstream (nginx answering a
fixed chat-completion JSON), so what is measured is what the proxy adds. wrk is the load generator.

- direct: wrk → upstream (the floor);
- nginx: wrk → nginx reverse proxy (keepalive) → upstream (the near-limit reference);
- gateway (1 and 2 workers): wrk → `python -m gateway` with auth (token digest), routing (the route
  table) and usage metering on (records shipped every second to a stub control plane that accepts them);
- bare aiohttp proxy: wrk → an aiohttp server that forwards the body with an aiohttp client (uvloop), no
  auth, routing or metering: the Python floor our gateway is built on;
- gateway, features on: the same gateway with the tenant's limits set (requests, tokens and requests in
  flight, all far above the load, so nothing is refused but every request pays for them), shared through
  Redis (``--redis``, default ``redis://127.0.0.1:6379/1``), the route table marking load, prefix routing
  on, and the response cache on for the model (its store in the same Redis): every request is
  deterministic (temperature 0) and different (a counter in the prompt), so each one is looked up, misses,
  and its answer is written to the cache: the cache's whole cost on a miss;
- gateway, cache hits: the same, with one fixed request, so every request after the first is answered
  from the cache (no upstream): what a hit costs;
- gateway, features on, sampled: the same gateway and table, the requests without ``temperature`` (each
  different too), so none is cacheable and the cache is never asked: what every feature costs traffic
  the cache cannot serve;
- with ``--baseline CHECKOUT``, that checkout's gateway (e.g. a ``git worktree`` of the commit before) on the
  same table, so "today's gateway" and the new one are measured in one run;
- litellm: wrk → LiteLLM proxy (one worker) → upstream, when ``--litellm`` names its executable
  (install it in a venv of its own: ``pip install 'litellm[proxy]==1.106.12'``).

    .venv/bin/python bench/gateway_bench.py [--seconds 10] [--baseline /tmp/base] [--litellm ...]

Needs Debian's nginx and wrk (``apt-get install nginx-light wrk``).
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "sk-bench-" + "x" * 48  # LiteLLM's master key and a tenant token of our gateway
ANSWER = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 1764000000,
    "model": "chat",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "a fixed answer"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13},
}
BODY = json.dumps(
    {"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}
)
# Every side gets the same request stream: deterministic (temperature 0), each one different (the wrk thread
# and a counter in the prompt, after a nonce per wrk run), so no response cache ever answers it.
VARYING = (
    'wrk.method = "POST"\n'
    'wrk.headers["Content-Type"] = "application/json"\n'
    f'wrk.headers["Authorization"] = "Bearer {TOKEN}"\n'
    "local threads = 0\n"
    "function setup(thread) threads = threads + 1; thread:set('id', threads) end\n"
    "function init(args) nonce = args[1] or ''; counter = 0 end\n"
    "function request()\n"
    "  counter = counter + 1\n"
    '  return wrk.format(nil, nil, nil, \'{"model":"chat","messages":[{"role":"user","content":"hello \''
    " .. nonce .. '-' .. id .. '-' .. counter .. '\"}],\"max_tokens\":8,\"temperature\":0}')\n"
    "end\n"
)
SAMPLED = VARYING.replace(',"temperature":0', "")  # the default temperature: never cacheable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on {port}")


def nginx_conf(folder: Path, upstream: int, proxy: int) -> Path:
    answer = json.dumps(ANSWER).replace("'", "\\'")
    conf = folder / "nginx.conf"
    conf.write_text(
        f"""
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {folder}/body; proxy_temp_path {folder}/proxy;
  fastcgi_temp_path {folder}/fcgi; uwsgi_temp_path {folder}/uwsgi; scgi_temp_path {folder}/scgi;
  keepalive_requests 1000000;
  upstream engine {{ server 127.0.0.1:{upstream}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{upstream};
    location / {{ default_type application/json; return 200 '{answer}'; }}
  }}
  server {{
    listen 127.0.0.1:{proxy};
    location / {{
      proxy_pass http://engine; proxy_http_version 1.1; proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""
    )
    return conf


STUB_CONTROL_PLANE = """
import asyncio, json, sys
from aiohttp import web
table = json.loads(sys.argv[2])
received = 0
async def config(request):
    if request.headers.get("If-None-Match", "").strip('"') == table["etag"]:
        await asyncio.sleep(float(request.query.get("wait", 0)))
        return web.Response(status=304)
    return web.json_response(table)
async def usage(request):
    global received
    received += len((await request.json())["records"])
    return web.json_response({"accepted": received})
app = web.Application()
app.router.add_get("/api/v1/routing/gateway-config/", config)
app.router.add_post("/api/v1/usage/", usage)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
"""


BARE_PROXY = """
import sys, aiohttp, uvloop
from aiohttp import web
upstream = sys.argv[2]
async def start(app):
    app["client"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
async def forward(request):
    body = await request.read()
    async with request.app["client"].post(upstream + request.path, data=body,
                                          headers={"Content-Type": "application/json"}) as reply:
        return web.Response(status=reply.status, body=await reply.read(), content_type="application/json")
app = web.Application()
app.on_startup.append(start)
app.router.add_post("/v1/chat/completions", forward)
uvloop.install()
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""
# Far above anything the bench sends: every request pays for the limiter, none is refused.
LIMITS = {"requests_per_minute": 10**9, "tokens_per_minute": 10**12, "concurrent_requests": 10**6}


def gateway_table(upstream: int, limits: dict[str, int] | None = None) -> dict[str, object]:
    endpoint = {
        "url": f"http://127.0.0.1:{upstream}",
        "region": "local-1",
        "priority": 0,
        "weight": 100,
        "deployment": 1,
        "version": "bench@1.0.0",
        "served_model": "chat",
        "artifact_sha256": "0" * 64,
        "shared": False,
        "saturated": False,
        "jurisdiction": "EU",
    }
    route: dict[str, object] = {"endpoints": [endpoint], "preferred": "local-1"}
    if limits:  # the features-on table: the model's answers cached too
        place = {"jurisdiction": "EU", "deployment": 1, "version": "bench@1.0.0", "artifact_sha256": "0" * 64}
        route["cache"] = {"ttl_seconds": 60, "places": [place]}
    body = {
        "tenants": {
            "bench": {
                "limits": limits or {},
                "blocked": "",
                "models": {"chat": route},
            }
        },
        "credentials": {
            hashlib.sha256(TOKEN.encode()).hexdigest(): {
                "tenants": ["bench"],
                "token": "bench000",
                "expires": None,
                "priority": "interactive",
            }
        },
    }
    return {"generation": 1, "etag": "bench", "table": body}


def wrk(port: int, connections: int, seconds: int, script: Path) -> dict[str, float]:
    threads = 1 if connections == 1 else 2
    out = subprocess.run(
        [
            "wrk",
            f"-t{threads}",
            f"-c{connections}",
            f"-d{seconds}s",
            "--latency",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}/v1/chat/completions",
            "--",
            str(time.time_ns()),  # the varying script's nonce: no run repeats another's requests
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def percentile(p: str) -> float:
        value, unit = re.search(rf"^\s+{p}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "p50": percentile("50"),
        "p99": percentile("99"),
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "errors": float(errors.group(1)) if errors else 0.0,
    }


def measure(name: str, port: int, seconds: int, script: Path, results: dict[str, dict[str, float]]) -> None:
    wait_port(port)
    wrk(port, 4, 2, script)  # warm up (connections, JIT-free but caches)
    one = wrk(port, 1, seconds, script)
    many = wrk(port, 32, seconds, script)
    results[name] = {
        "c1_p50": one["p50"],
        "c32_p50": many["p50"],
        "c32_p99": many["p99"],
        "rps": many["rps"],
        "errors": one["errors"] + many["errors"],
    }
    print(f"  measured {name}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--litellm", default="", help="path of LiteLLM's `litellm` executable")
    parser.add_argument("--baseline", type=Path, help="a checkout whose gateway is measured too")
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/1", help="the Redis limits are shared in")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    script, fixed, sampled = folder / "chat.lua", folder / "fixed.lua", folder / "sampled.lua"
    script.write_text(VARYING)
    sampled.write_text(SAMPLED)
    fixed.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = '{BODY}'\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
        f'wrk.headers["Authorization"] = "Bearer {TOKEN}"\n'
    )
    upstream, proxy, control, limited = free_port(), free_port(), free_port(), free_port()
    procs: list[subprocess.Popen[bytes]] = []
    results: dict[str, dict[str, float]] = {}

    def start(cmd: list[str], cwd: Path = ROOT, **env: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            cmd, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd
        )
        procs.append(proc)
        return proc

    def stop(proc: subprocess.Popen[bytes]) -> None:
        proc.terminate()
        proc.wait(timeout=30)
        procs.remove(proc)

    try:
        start(["nginx", "-c", str(nginx_conf(folder, upstream, proxy)), "-g", "daemon off;"])
        start([sys.executable, "-c", STUB_CONTROL_PLANE, str(control), json.dumps(gateway_table(upstream))])
        table = json.dumps(gateway_table(upstream, LIMITS))
        start([sys.executable, "-c", STUB_CONTROL_PLANE, str(limited), table])
        wait_port(control), wait_port(limited)
        measure("direct (upstream)", upstream, args.seconds, script, results)
        measure("nginx reverse proxy", proxy, args.seconds, script, results)
        port = free_port()
        bare = start([sys.executable, "-c", BARE_PROXY, str(port), f"http://127.0.0.1:{upstream}"])
        measure("bare aiohttp proxy", port, args.seconds, script, results)
        stop(bare)
        features = {"GATEWAY_REDIS_URL": args.redis, "GATEWAY_RESPONSE_CACHE_STORES": f"EU={args.redis}"}
        sides = [
            ("our gateway", ROOT, control, {}, script),
            ("gateway, features on", ROOT, limited, features, script),
            ("gateway, cache hits", ROOT, limited, features, fixed),
            ("gateway, features on, sampled", ROOT, limited, features, sampled),
        ]
        if args.baseline:
            sides.insert(
                0,
                (
                    "today's gateway",
                    args.baseline.resolve(),
                    limited,
                    {"PYTHONPATH": str(args.baseline.resolve())},
                    script,
                ),
            )
        for workers in (1, 2):
            for name, checkout, plane, env, requests in sides:
                port = free_port()
                gateway = start(
                    [sys.executable, "-m", "gateway", "--port", str(port), "--workers", str(workers)],
                    cwd=checkout,
                    CONTROL_PLANE_URL=f"http://127.0.0.1:{plane}",
                    GATEWAY_TOKEN="bench",
                    GATEWAY_STATE_DIR=str(folder / f"state-{port}"),
                    **env,
                )
                time.sleep(2)  # route table fetched
                measure(f"{name}, {workers}w", port, args.seconds, requests, results)
                stop(gateway)
        if args.litellm:
            port = free_port()
            config = folder / "litellm.yaml"
            config.write_text(
                "model_list:\n  - model_name: chat\n    litellm_params:\n      model: openai/chat\n"
                f"      api_base: http://127.0.0.1:{upstream}/v1\n      api_key: none\n"
            )
            litellm = start(
                [args.litellm, "--config", str(config), "--port", str(port), "--num_workers", "1"],
                LITELLM_LOCAL_MODEL_COST_MAP="True",
                LITELLM_MASTER_KEY=TOKEN,  # auth on, as on our side
            )
            try:
                wait_port(port, timeout=180)
                time.sleep(3)
                measure("LiteLLM proxy 1 worker", port, args.seconds, script, results)
            except RuntimeError as exc:  # the other sides' figures still print
                print(f"  LiteLLM not measured: {exc}", flush=True)
            stop(litellm)
    finally:
        for proc in list(procs):
            proc.terminate()
            proc.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)

    floor = results["direct (upstream)"]["c1_p50"]
    print(
        f"\n{'side':<32} {'c=1 p50':>9} {'added':>8} {'c=32 p50':>9} {'c=32 p99':>9} "
        f"{'req/s':>8} {'errors':>7}"
    )
    for name, r in results.items():
        added = r["c1_p50"] - floor
        print(
            f"{name:<32} {r['c1_p50']:>7.2f}ms {added:>6.2f}ms {r['c32_p50']:>7.2f}ms {r['c32_p99']:>7.2f}ms "
            f"{r['rps']:>8.0f} {r['errors']:>7.0f}"
        )


if __name__ == "__main__":
    main()
