"""Processes the tests start (workers, servers, the gateway): their environment, a free port, waiting."""

import socket


def database_url() -> str:
    """The URL of the database the tests run on, for processes the tests start (workers, servers)."""
    from django.db import connection

    cfg = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{cfg['NAME']}"
    auth = cfg["USER"] + (f":{cfg['PASSWORD']}" if cfg["PASSWORD"] else "")
    return f"postgres://{auth}@{cfg['HOST'] or '127.0.0.1'}:{cfg['PORT'] or 5432}/{cfg['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    import os

    from django.conf import settings

    from core.services.audit_checkpoints import checkpoint_key

    checkpoint_key()  # created here: a child given a key file never generates one itself
    audit = {
        "AUDIT_CHECKPOINT_DIR": settings.AUDIT_CHECKPOINT_DIR,
        "AUDIT_CHECKPOINT_KEY_FILE": settings.AUDIT_CHECKPOINT_KEY_FILE,
    }
    return {**os.environ, "DATABASE_URL": database_url(), "LOG_FORMAT": "text", **audit, **extra}


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2):  # type: ignore[no-untyped-def]
    import time

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
