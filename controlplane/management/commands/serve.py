"""Run the whole control plane in the foreground: web (gunicorn), Celery worker and beat, the routing loop
and the gateway.

Ctrl-C (or SIGTERM) stops everything it started; if any process dies, the others are stopped too.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from controlplane.management.commands.seed_demo import DEMO_PASSWORD, USERS
from regions.choices import DriverKind
from regions.drivers.factory import default_state_dir, driver_for, engine_of
from regions.models import Region

# A warnings filter (action:message-prefix) for Celery's "superuser privileges" SecurityWarning.
ROOT_WORKER_WARNING = "ignore:You're running the worker with superuser privileges"


class Command(BaseCommand):
    help = "Run web, worker and scheduler together (the README's run command)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--bind", default=os.environ.get("CONTROLPLANE_BIND", "127.0.0.1:8000"))
        parser.add_argument("--web-workers", type=int, default=2)
        parser.add_argument("--gateway-port", type=int, default=int(os.environ.get("GATEWAY_PORT", "8080")))

    def _commands(self, bind: str, web_workers: int, gateway_port: int) -> dict[str, list[str]]:
        py = sys.executable
        host = bind.rsplit(":", 1)[0]
        return {
            "web": [
                py,
                "-m",
                "gunicorn",
                "controlplane.wsgi",
                "--bind",
                bind,
                "--workers",
                str(web_workers),
                # Threads, so gateways' long-polls (up to 30 s each) never hold every worker.
                "--threads",
                "8",
                "--access-logfile",
                "-",
                "--graceful-timeout",
                "5",
                # gunicorn's control socket defaults to ~/.gunicorn/; keep all local state under var/.
                "--control-socket",
                str(settings.VAR_DIR / "gunicorn.ctl"),
            ],
            "worker": [
                py,
                "-m",
                "celery",
                "-A",
                "controlplane",
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
                "--hostname",
                "worker@%h",
            ],
            "beat": [py, "-m", "celery", "-A", "controlplane", "beat", "--loglevel", "INFO"],
            # Through django (not ./manage.py) so it runs from an installed wheel and from any directory.
            "router": [py, "-m", "django", "route"],
            "gateway": [py, "-m", "gateway", "--host", host, "--port", str(gateway_port)],
        }

    def _environment(self) -> dict[str, str]:
        # All processes write their metrics into one folder so /metrics shows web and task counts together.
        metrics_dir = settings.VAR_DIR / "prometheus"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        return {
            **os.environ,
            "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
            # The gateway reaches the control plane over HTTP like any other gateway would.
            "CONTROL_PLANE_URL": f"http://{self._bind}",
            "GATEWAY_TOKEN_FILE": str(settings.VAR_DIR / "tokens" / "gateway"),
            "GATEWAY_CACHE_FILE": str(settings.VAR_DIR / "gateway-routes.json"),
            # With a Redis, tenants' limits hold once for the gateway's processes (docs/routing.md).
            "GATEWAY_REDIS_URL": os.environ.get("GATEWAY_REDIS_URL", settings.REDIS_URL or ""),
            "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "controlplane.settings"),
        }

    def _process_environment(self, name: str, env: dict[str, str]) -> dict[str, str]:
        if name == "worker" and os.geteuid() == 0:
            # Celery warns on every start as root and asks for --uid. serve is the local demo: it runs as
            # whoever started it (root in containers and CI), and dropping to another user would lock the
            # worker out of var/ (the SQLite file, the broker folder). The warning exists because a root
            # worker that accepts pickle runs arbitrary code; this worker accepts JSON only
            # (CELERY_ACCEPT_CONTENT), so only that one warning is silenced, only here. Production runs
            # the worker as its own unprivileged user (docs/operations.md).
            filters = [f for f in (env.get("PYTHONWARNINGS"),) if f]
            return {**env, "PYTHONWARNINGS": ",".join([*filters, ROOT_WORKER_WARNING])}
        return env

    def handle(self, *args: Any, **opts: Any) -> None:
        self._bind = opts["bind"]
        env = self._environment()
        procs = {
            name: subprocess.Popen(cmd, env=self._process_environment(name, env), start_new_session=True)
            for name, cmd in self._commands(opts["bind"], opts["web_workers"], opts["gateway_port"]).items()
        }
        self._banner(opts["bind"], opts["gateway_port"])
        stopping = False

        def stop(*_: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        while not stopping and all(p.poll() is None for p in procs.values()):
            time.sleep(0.5)
        for name, proc in procs.items():
            if proc.poll() is not None and not stopping:
                self.stderr.write(f"{name} exited with {proc.returncode}; stopping the others.")
        self._stop(procs)

    def _stop(self, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        # SIGTERM to each leader only: gunicorn and Celery stop their own workers (signalled directly, a
        # Celery pool child logs an ERROR for every Ctrl-C). What is left of a group afterwards is killed.
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)  # reaped: nothing of ours outlives this command
        self.stdout.write("Stopped web, worker, scheduler, router and gateway.")
        stopped = self._stop_local_engines()
        if stopped:
            self.stdout.write(f"Stopped {stopped} local engine workload(s); the next run starts them again.")

    def _stop_local_engines(self) -> int:
        """Engines of the local process regions outlive workers by design (like pods outlive a controller);
        when the whole local control plane stops, they stop too instead of holding gigabytes of memory."""
        count = 0
        for region in Region.objects.filter(driver=DriverKind.PROCESS):
            root = Path(region.driver_config.get("state_dir") or default_state_dir(region.code))
            for workload in root.glob("cp-*") if root.exists() else []:
                driver_for(region).delete(workload.name)
                count += 1
        return count

    def _banner(self, bind: str, gateway_port: int) -> None:
        users = ", ".join(name for name, *_ in USERS)
        engines = ", ".join(f"{r.code}: {engine_of(r)}" for r in Region.objects.order_by("code")) or "none"
        self.stdout.write(
            "\n"
            f"  Control plane:  http://{bind}/\n"
            f"  API docs:       http://{bind}/api/docs/\n"
            f"  Demo users:     {users}\n"
            f"  Demo password:  {DEMO_PASSWORD}\n"
            f"  Region engines: {engines}\n"
            f"  Gateway:        http://{bind.rsplit(':', 1)[0]}:{gateway_port}/v1 (OpenAI-compatible)\n"
            f"  Tenant tokens:  {settings.VAR_DIR / 'tokens'}/<tenant> (Authorization: Bearer …)\n"
            "  Worker and scheduler are running. Press Ctrl-C to stop everything.\n"
        )
