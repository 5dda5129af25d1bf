"""The process driver: each replica is an OpenAI-compatible engine process on this host.

Used for bare-metal and VM GPU hosts and for the embedded local default. The driver is the "cluster
controller" here: ``apply`` starts missing replicas, restarts dead ones with exponential backoff, restarts
replicas whose spec changed and stops extra ones. All state lives in files under the region's
``state_dir`` (one folder per workload, one JSON file per replica), so any worker process can pick up
where another left off: engines run in their own sessions and outlive the worker that started them.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from core.errors import ValidationFailed
from regions import hooks
from regions.drivers.base import (
    DriverError,
    ObservedWorkload,
    WorkloadSpec,
    check_model_source,
    check_otlp_traces_endpoint,
    tracing_flags,
)
from regions.engine_keys import workload_api_key
from registry.engine_args import render_flags, vllm_available

CRASH_LOOP_RESTARTS = 3  # after this many quick deaths the error is reported as permanent
QUICK_DEATH_SECONDS = 90


@dataclass(frozen=True)
class ProcessConfig:
    state_dir: str
    engine: str = "auto"  # "vllm", "simulator" or "auto" (vLLM when installed)
    host: str = "127.0.0.1"
    kv_cache_gib: int = 1
    max_backoff_seconds: int = 60
    # vLLM's CPU backend pins its OpenMP threads ("auto": the same cores for every engine it starts), so
    # two engines on one host (a rollout's baseline and candidate) would share one core while the others
    # idle, and the busier engine starves the other. "nobind" leaves placement to the kernel.
    cpu_bind: str = "nobind"
    # Threads per vLLM engine (OMP_NUM_THREADS); None: all cores. Engines sharing a small host run best with
    # a thread or a few each: OpenMP regions wait on their slowest thread, so oversubscribed cores slow the
    # engine with less traffic most (its baseline's load preempts it).
    cpu_threads: int | None = None
    # Where vLLM sends its own spans (``--otlp-traces-endpoint``): it continues the gateway's trace (the
    # gateway passes ``traceparent``) with its queue, prefill and decode times. '' leaves tracing off.
    otlp_traces_endpoint: str = ""

    @classmethod
    def parse(cls, raw: dict[str, Any], default_state_dir: str) -> "ProcessConfig":
        unknown = set(raw) - {
            "state_dir",
            "engine",
            "host",
            "kv_cache_gib",
            "max_backoff_seconds",
            "cpu_bind",
            "cpu_threads",
            "otlp_traces_endpoint",
        }
        if unknown:
            raise ValidationFailed(f"Unknown process driver setting(s): {', '.join(sorted(unknown))}.")
        config = cls(**{"state_dir": default_state_dir, **raw})
        if config.engine not in {"auto", "vllm", "simulator"}:
            raise ValidationFailed("engine must be auto, vllm or simulator.")
        if not isinstance(config.cpu_bind, str) or not config.cpu_bind:
            raise ValidationFailed("cpu_bind must be auto, nobind or vLLM's core list (e.g. 0-3).")
        threads = config.cpu_threads
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise ValidationFailed("cpu_threads must be a whole number of at least 1 (or left out).")
        check_otlp_traces_endpoint(config.otlp_traces_endpoint)
        return config

    @property
    def resolved_engine(self) -> str:
        if self.engine == "auto":
            return "vllm" if vllm_available() else "simulator"
        return self.engine


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _alive(pid: int, port: int) -> bool:
    """The process exists, is not a zombie, and is the engine we started (not a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z" and str(port).encode() in cmdline


def _health(host: str, port: int) -> str:
    """ "ok"; "slow" when /health did not answer within a second (an engine busy on shared CPUs); "down"
    when it refused or answered an error."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=1) as response:
            return "ok" if response.status == 200 else "down"
    except TimeoutError:
        return "slow"
    except urllib.error.URLError as exc:
        return "slow" if isinstance(exc.reason, TimeoutError) else "down"
    except OSError:
        return "down"


def _log_tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    meaningful = [line for line in text.splitlines() if line.strip()]
    return "\n".join(meaningful[-lines:])[-1500:]


class ProcessDriver:
    def __init__(self, config: ProcessConfig):
        self.config = config
        self.root = Path(config.state_dir)

    # --- the interface ----------------------------------------------------------------------------

    def apply(self, spec: WorkloadSpec, absent: bool = False) -> None:
        folder = self.root / spec.name
        folder.mkdir(parents=True, exist_ok=True)
        scheduled = time.time()
        self._model_path(spec)  # fetch into the host cache; fails early on an artifact we cannot reach
        # This apply's own clock: one driver serves all of a region's reconcile threads at once.
        timing = {"scheduled_at": scheduled, "cached_at": time.time()}
        (folder / "spec.json").write_text(
            json.dumps({"hash": spec.spec_hash, "replicas": spec.replicas, "spec": asdict(spec)})
        )
        for index in range(spec.replicas):
            self._ensure_running(folder, index, spec, timing)
        for extra in self._replica_files(folder):
            if int(extra.stem.split("-")[1]) >= spec.replicas:
                self._stop(json.loads(extra.read_text()))
                extra.unlink()

    def survey(self, starting: bool = False) -> None:
        """Whether a host's engine answers is only known by asking it: every target is observed."""
        return None

    def observe(self, name: str) -> ObservedWorkload | None:
        folder = self.root / name
        spec_file = folder / "spec.json"
        if not spec_file.exists():
            return None
        desired = json.loads(spec_file.read_text())
        ready, endpoints, repair, problem, permanent = 0, [], False, "", False
        cold_starts: list[dict[str, float]] = []
        for index in range(desired["replicas"]):
            state = self._read(folder, index)
            if state is None or state["hash"] != desired["hash"] or not _alive(state["pid"], state["port"]):
                repair = True
                if state is not None and state.get("restarts", 0) >= 1:
                    tail = _log_tail(folder / f"replica-{index}.log")
                    problem = f"replica {index} exited; engine output:\n{tail}"
                    permanent = permanent or self._crash_looping(state)
                continue
            # A live process that has answered before and is only slow now is busy, not dead: whether it
            # takes traffic is the router's probes' call (with their hysteresis), not a replica count's.
            health = _health(self.config.host, state["port"])
            if health == "ok" or (health == "slow" and "ready_at" in state):
                ready += 1
                endpoints.append(f"http://{self.config.host}:{state['port']}")
                cold_starts.append(self._cold_start(folder, index, state))
        return ObservedWorkload(
            desired["hash"], desired["replicas"], ready, endpoints, repair, problem, permanent, cold_starts
        )

    def _cold_start(self, folder: Path, index: int, state: dict[str, Any]) -> dict[str, float]:
        """Scheduled → weights cached → engine ready, in seconds (ready_at: the first healthy answer)."""
        if "ready_at" not in state:
            state["ready_at"] = time.time()
            (folder / f"replica-{index}.json").write_text(json.dumps(state))
        scheduled = state.get("scheduled_at", state["started_at"])
        cached = state.get("cached_at", state["started_at"])
        return {
            "replica": index,
            "weights_seconds": round(cached - scheduled, 2),
            "engine_seconds": round(state["ready_at"] - state["started_at"], 2),
            "total_seconds": round(state["ready_at"] - scheduled, 2),
        }

    def delete(self, name: str) -> None:
        folder = self.root / name
        for replica in self._replica_files(folder):
            self._stop(json.loads(replica.read_text()))
        shutil.rmtree(folder, ignore_errors=True)

    def render(self, spec: WorkloadSpec) -> str:
        lines = [
            f"# {spec.replicas} replica(s) of {spec.served_model_name} on {self.config.host}, "
            f"engine: {self.config.resolved_engine}"
        ]
        env = " ".join(
            f"{k}={v}" for k, v in sorted(self._env(Path("<state>")).items()) if k not in os.environ
        )
        command = " ".join(
            self._command(spec, port=0, model_path="<model cache>" if spec.model_store else None)
        )
        lines.append(f"{env} {command}".replace("--port 0", "--port <allocated>"))
        return "\n".join(lines) + "\n"

    # --- replicas ---------------------------------------------------------------------------------

    def _replica_files(self, folder: Path) -> list[Path]:
        return sorted(folder.glob("replica-*.json")) if folder.exists() else []

    def _read(self, folder: Path, index: int) -> dict[str, Any] | None:
        path = folder / f"replica-{index}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def _crash_looping(self, state: dict[str, Any]) -> bool:
        lived = state.get("exited_after", QUICK_DEATH_SECONDS + 1)
        return bool(state.get("restarts", 0) >= CRASH_LOOP_RESTARTS and lived < QUICK_DEATH_SECONDS)

    def _ensure_running(self, folder: Path, index: int, spec: WorkloadSpec, timing: dict[str, float]) -> None:
        state = self._read(folder, index)
        if state is not None and state["hash"] == spec.spec_hash and _alive(state["pid"], state["port"]):
            return
        restarts = 0
        if state is not None:
            if state["hash"] == spec.spec_hash:  # it died: restart with backoff
                if time.time() < state.get("next_restart_at", 0):
                    return
                restarts = state.get("restarts", 0) + 1
                state["exited_after"] = time.time() - state["started_at"]
            self._stop(state)
        self._start(folder, index, spec, restarts, state, timing)

    def _start(
        self,
        folder: Path,
        index: int,
        spec: WorkloadSpec,
        restarts: int,
        previous: dict[str, Any] | None,
        timing: dict[str, float],
    ) -> None:
        port = _free_port(self.config.host)
        log = (folder / f"replica-{index}.log").open("ab")
        try:
            process = subprocess.Popen(
                self._command(spec, port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._engine_env(folder, spec),
                start_new_session=True,
                cwd=folder,
            )
        except OSError as exc:
            raise DriverError(f"cannot start the engine: {exc}", permanent=True) from exc
        finally:
            log.close()
        backoff = min(self.config.max_backoff_seconds, 2**restarts) if restarts else 0
        state = {
            "pid": process.pid,
            "port": port,
            "hash": spec.spec_hash,
            "started_at": time.time(),
            "restarts": restarts,
            "next_restart_at": time.time() + backoff,
            "exited_after": (previous or {}).get("exited_after"),
            **timing,
        }
        (folder / f"replica-{index}.json").write_text(json.dumps(state))

    def _stop(self, state: dict[str, Any]) -> None:
        pid, port = state["pid"], state["port"]
        if not _alive(pid, port):
            return
        try:
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while _alive(pid, port) and time.monotonic() < deadline:
                time.sleep(0.2)
            if _alive(pid, port):
                os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # --- engines ----------------------------------------------------------------------------------

    def _model_path(self, spec: WorkloadSpec) -> str:
        if spec.model_store:
            return self._cached_model(spec)
        uri = urlparse(spec.model_uri)
        if uri.scheme != "file":
            raise DriverError(
                f"{spec.model_uri} is not on this host: the process driver serves file:// artifacts "
                "(copies from object stores arrive with artifact replication).",
                permanent=True,
            )
        check_model_source(spec.model_uri)
        if not Path(uri.path).is_dir():
            raise DriverError(f"model directory {uri.path} does not exist on this host", permanent=True)
        return uri.path

    def _cached_model(self, spec: WorkloadSpec) -> str:
        """Fill the host's model cache from the region's own store (never across regions), once per file.
        The store is read through the artifacts app (regions.hooks), which owns object stores."""
        provider = hooks.weights_provider()
        if provider is None:
            raise DriverError(f"cannot fill the model cache: {hooks.NO_WEIGHTS_PROVIDER}")
        store = provider.reader(spec.model_store)
        folder = self.root / ".models" / spec.spec_hash[:16]
        for path, sha in spec.model_files:
            target = folder / path
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_suffix(target.suffix + ".partial")
            try:
                with partial.open("wb") as out:
                    for chunk in store.stream(sha):
                        out.write(chunk)
            except Exception as exc:
                raise DriverError(f"cannot fetch {path} from {store.label}: {exc}") from exc
            partial.rename(target)
        return str(folder)

    def _engine_env(self, folder: Path, spec: WorkloadSpec) -> dict[str, str]:
        """The engine's environment: ours, the engine settings and its API key (never in ``render``)."""
        env = {k: v for k, v in os.environ.items() if k != "VLLM_API_KEY"}
        key = workload_api_key(spec)
        return {**env, **self._env(folder), **({"VLLM_API_KEY": key} if key else {})}

    def _env(self, folder: Path) -> dict[str, str]:
        cache = str(folder / ".cache")
        return {
            "HF_HUB_OFFLINE": "1",
            "HF_HOME": cache,
            "VLLM_CACHE_ROOT": cache,
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CPU_KVCACHE_SPACE": str(self.config.kv_cache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": self.config.cpu_bind,
            **({"OMP_NUM_THREADS": str(self.config.cpu_threads)} if self.config.cpu_threads else {}),
            "PYTHONUNBUFFERED": "1",
        }

    def _command(self, spec: WorkloadSpec, port: int, model_path: str | None = None) -> list[str]:
        module = (
            "vllm.entrypoints.openai.api_server"
            if self.config.resolved_engine == "vllm"
            else "regions.engines.simulator"
        )
        return [
            sys.executable,
            "-m",
            module,
            "--model",
            model_path or self._model_path(spec),
            "--served-model-name",
            spec.served_model_name,
            "--host",
            self.config.host,
            "--port",
            str(port),
            *render_flags(spec.engine_args),
            *self._tracing_flags(),
        ]

    def _tracing_flags(self) -> list[str]:
        if self.config.resolved_engine == "vllm":  # the simulator has no tracing
            return tracing_flags(self.config.otlp_traces_endpoint)
        return []
