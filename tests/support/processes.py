"""Processes the tests start (workers, servers, the gateway): their environment, a free port, waiting,
stopping."""

import contextlib
import os
import signal
import socket
import subprocess
import time


def database_url() -> str:
    """The URL of the database the tests run on, for processes the tests start (workers, servers)."""
    from django.db import connection

    cfg = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{cfg['NAME']}"
    auth = cfg["USER"] + (f":{cfg['PASSWORD']}" if cfg["PASSWORD"] else "")
    return f"postgres://{auth}@{cfg['HOST'] or '127.0.0.1'}:{cfg['PORT'] or 5432}/{cfg['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    from django.conf import settings

    from core.services.audit_checkpoints import checkpoint_key

    checkpoint_key()  # created here: a child given a key file never generates one itself
    audit = {
        "AUDIT_CHECKPOINT_DIR": settings.AUDIT_CHECKPOINT_DIR,
        "AUDIT_CHECKPOINT_KEY_FILE": settings.AUDIT_CHECKPOINT_KEY_FILE,
    }
    return {**os.environ, "DATABASE_URL": database_url(), "LOG_FORMAT": "text", **audit, **extra}


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_all(procs, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM every process still running, as an orchestrator stops a pod, and wait for them together. One
    that is still running after ``timeout`` is killed (so it holds no connection past the test) and fails
    the test: stopping cleanly on SIGTERM is part of what each process promises."""
    running = [proc for proc in procs if proc.poll() is None]
    for proc in running:
        proc.terminate()
    deadline = time.monotonic() + timeout
    stuck = []
    for proc in running:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            stuck.append(proc)
            with contextlib.suppress(ProcessLookupError):  # it may have exited just now
                if os.getpgid(proc.pid) == proc.pid:  # a session of its own: its children go with it
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    proc.kill()
            proc.wait(timeout=10)
    assert not stuck, f"still running {timeout} s after SIGTERM: {[proc.args for proc in stuck]}"
