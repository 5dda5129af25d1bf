"""The processes and loops bench/activation_bench.py runs a trial on: a throwaway PostgreSQL database, the
control plane under gunicorn, the gateway, and the reconciler and router loops (in this process, or as
`serve` runs them)."""

import contextlib
import io
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[1]
TENANT, MODEL, REGION = "acme-eu", "chat", "eu-west-1"  # seed_demo's deployment
IDLE_POLICY = {"min_replicas": 0, "max_replicas": 2, "running": 4, "idle_seconds": 60}


def fresh_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')
        conn.execute(f'create database "{name}"')


def drop_database(url: str) -> None:
    import psycopg
    from django.db import connections

    connections.close_all()
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}" with (force)')


def configure(url: str, var_dir: Path) -> None:
    """The environment of this process and of every process it starts (gunicorn, gateway, engines)."""
    os.environ.update(
        DATABASE_URL=url,
        CONTROLPLANE_VAR_DIR=str(var_dir),
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        LOG_FORMAT="text",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    import django

    django.setup()


def seed(engine: str) -> Any:
    """The demo world (tenants, tokens, regions with the chosen engine, tiny-llama deployed as `chat`)."""
    from django.core.management import call_command

    from autoscaling.services.policies import policy_set
    from core.services.audit_checkpoints import checkpoint_key
    from regions.models import Deployment

    call_command("migrate", verbosity=0)
    call_command("seed_demo", engine=engine, verbosity=0, stdout=io.StringIO())
    checkpoint_key()  # created here, before the children start: none of them generates its own
    deployment = Deployment.objects.get(owner__slug=TENANT, name=MODEL)
    policy_set(actor=actor(), deployment=deployment, body=IDLE_POLICY)
    return deployment


def actor() -> Any:
    from core.choices import AuditSource
    from core.principal import Principal

    return Principal.system("activation-bench", source=AuditSource.COMMAND)


def token(name: str) -> str:
    from django.conf import settings

    return (settings.VAR_DIR / "tokens" / name).read_text().strip()


# --- the processes: web app and gateway ------------------------------------------------------------------


def start_web(port: int, var_dir: Path) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "gunicorn", "controlplane.wsgi", "--bind", f"127.0.0.1:{port}",
        "--workers", "1", "--threads", "8", "--graceful-timeout", "5",
        "--control-socket", str(var_dir / "gunicorn.ctl"),
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, stdout=(var_dir / "web.log").open("ab"), stderr=subprocess.STDOUT
    )


def start_gateway(port: int, control_plane: str, var_dir: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "CONTROL_PLANE_URL": control_plane,
        "GATEWAY_TOKEN": token("gateway"),
        "GATEWAY_CACHE_FILE": str(var_dir / "gateway-routes.json"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "gateway", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=(var_dir / "gateway.log").open("ab"),
        stderr=subprocess.STDOUT,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def until(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException, ValueError, OSError):
            if found := predicate():
                return found
        time.sleep(every)
    raise RuntimeError(f"{what}: not within {timeout:g} s")


def gateway_health(url: str, session: requests.Session | None = None) -> dict[str, Any]:
    return (session or requests).get(f"{url}/healthz", timeout=1).json()  # type: ignore[no-any-return]


# --- the production loops, run here ---------------------------------------------------------------------


class Loop(threading.Thread):
    """One of production's loops: ``step`` every ``interval`` s (start to start, as `route` sleeps),
    until stopped. ``paused()`` holds it between two steps."""

    def __init__(self, name: str, step: Callable[[], None], interval: float):
        super().__init__(name=name, daemon=True)
        self.step, self.interval = step, interval
        self.stopping, self.lock = threading.Event(), threading.Lock()
        self.delay = 0.0

    def shift(self) -> None:
        """Move the loop's phase by a random part of its interval (before a trial: the two loops run at
        commensurate intervals, so without it every trial would see them in the same phase)."""
        self.delay = random.uniform(0, self.interval)

    def run(self) -> None:
        from django.db import close_old_connections

        while not self.stopping.is_set():
            started = time.monotonic()
            with self.lock:
                try:
                    self.step()
                except Exception as exc:  # a bad round must not stop the loop (as in production)
                    print(f"  [{self.name}] round failed: {exc}", flush=True)
                finally:
                    close_old_connections()
            pause, self.delay = max(0.0, self.interval - (time.monotonic() - started)) + self.delay, 0.0
            self.stopping.wait(pause)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self.lock:
            yield

    def finish(self) -> None:
        self.stopping.set()
        self.join(timeout=60)


def reconcile_every_region() -> None:
    from regions import reconciler

    for region_id in reconciler.region_ids():
        reconciler.reconcile_region(region_id)


def route_cycle() -> None:
    from routing import health

    health.cycle()


def start_serve_loops(var_dir: Path) -> list[subprocess.Popen[bytes]]:
    """The loops as `manage.py serve` runs them: a Celery worker (the embedded filesystem broker) that
    takes the reconcile a scale enqueues on commit, beat (the periodic reconcile and autoscale passes,
    every 15 s by default) and the router (`manage.py route`, every second)."""
    celery = [sys.executable, "-m", "celery", "-A", "controlplane"]
    commands = {
        "worker": [*celery, "worker", "--loglevel", "WARNING", "--concurrency", "2", "-n", "bench@%h"],
        "beat": [*celery, "beat", "--loglevel", "WARNING"],
        "router": [sys.executable, "-m", "django", "route"],
    }
    env = {**os.environ, "PYTHONWARNINGS": "ignore:You're running the worker with superuser privileges"}
    return [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=(var_dir / f"{name}.log").open("ab"), stderr=subprocess.STDOUT
        )
        for name, command in commands.items()
    ]


# --- one trial -------------------------------------------------------------------------------------------
