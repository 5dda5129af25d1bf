"""Failover through the gateway: kill the engine serving a tenant's model while a client keeps calling.

Two engines (the built-in simulator, OpenAI-compatible) stand in for a home region (tier 0) and the next
compliant region (tier 1) of one route; `python -m gateway` routes to them from a table served by a stub
control plane (the route table is not updated during the trial: this measures the data plane alone,
the worst case before the router's probes change the table). Four clients call continuously; the home
engine is SIGKILLed; we report the time from the kill to the first answer served by the other region,
and every failed request.

    .venv/bin/python bench/failover_bench.py [--trials 5]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gateway_bench import STUB_CONTROL_PLANE, TOKEN, free_port, gateway_table, wait_port

ROOT = Path(__file__).resolve().parents[1]


def engine(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "regions.engines.simulator", "--model", "chat", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def table(home: int, other: int) -> dict[str, object]:
    body = gateway_table(home)
    route = body["table"]["tenants"]["bench"]["models"]["chat"]  # type: ignore[index]
    second = dict(route["endpoints"][0], url=f"http://127.0.0.1:{other}", region="other-1", priority=1)
    route["endpoints"][0]["region"] = "home-1"
    route["endpoints"].append(second)
    return body


def trial(gateway: str, home: subprocess.Popen[bytes]) -> tuple[float, int, int]:
    served: list[tuple[float, int, str]] = []
    stop = threading.Event()
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def client() -> None:
        session = requests.Session()
        while not stop.is_set():
            try:
                reply = session.post(
                    f"{gateway}/v1/chat/completions",
                    json=body,
                    timeout=10,
                    headers={"Authorization": f"Bearer {TOKEN}"},
                )
                served.append((time.monotonic(), reply.status_code, reply.headers.get("x-served-region", "")))
            except requests.RequestException:
                served.append((time.monotonic(), 0, ""))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    os.killpg(home.pid, signal.SIGKILL)
    killed = time.monotonic()
    time.sleep(2.0)
    stop.set()
    for thread in threads:
        thread.join()
    after = [t for t, status, region in served if t > killed and region == "other-1"]
    failed = sum(1 for _, status, _ in served if status != 200)
    return (min(after) - killed if after else float("inf")), failed, len(served)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    print(f"{'trial':>5} {'kill → first answer elsewhere':>30} {'failed':>7} {'requests':>9}")
    for number in range(1, args.trials + 1):
        home_port, other_port, control, port = free_port(), free_port(), free_port(), free_port()
        home, other = engine(home_port), engine(other_port)
        stub = subprocess.Popen(
            [sys.executable, "-c", STUB_CONTROL_PLANE, str(control), json.dumps(table(home_port, other_port))]
        )
        env = {**os.environ, "CONTROL_PLANE_URL": f"http://127.0.0.1:{control}", "GATEWAY_TOKEN": "bench"}
        gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--port", str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for waited in (home_port, other_port, control, port):
                wait_port(waited)
            time.sleep(1.5)  # the route table arrives
            seconds, failed, total = trial(f"http://127.0.0.1:{port}", home)
            print(f"{number:>5} {seconds * 1000:>27.1f} ms {failed:>7} {total:>9}", flush=True)
        finally:
            for proc in (gateway, stub):
                proc.terminate()
                proc.wait()
            for proc in (home, other):
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


if __name__ == "__main__":
    main()
