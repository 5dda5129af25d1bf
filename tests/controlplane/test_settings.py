"""Settings: secure defaults, production requirements and Django's deployment checklist."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings

ROOT = Path(__file__).resolve().parents[2]


def run_manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_ALLOW_ASYNC_UNSAFE"}
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_debug_is_off_by_default():
    assert settings.DEBUG is False


@pytest.mark.subprocess  # runs manage.py
def test_deploy_check_passes_under_production_settings(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x" * 30 + "-production-secret-key-with-enough-entropy-0123456789")
    result = run_manage(
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        ALLOWED_HOSTS="cp.example.com",
        CSRF_TRUSTED_ORIGINS="https://cp.example.com",
        SECRET_KEY_FILE=str(secret),
        AUDIT_CHECKPOINT_KEY_FILE=str(secret),
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.subprocess  # runs manage.py
def test_deploy_check_warns_when_audit_checkpoints_are_off(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("x" * 30 + "-production-secret-key-with-enough-entropy-0123456789")
    env = {"ALLOWED_HOSTS": "cp.example.com", "SECRET_KEY_FILE": str(secret)}
    off = run_manage("check", "--deploy", **env)
    assert "controlplane.W001" in off.stderr + off.stdout
    missing = run_manage("check", "--deploy", AUDIT_CHECKPOINT_KEY_FILE=str(tmp_path / "missing"), **env)
    assert missing.returncode != 0 and "controlplane.E001" in missing.stderr + missing.stdout


@pytest.mark.subprocess  # runs manage.py
def test_production_without_secret_key_refuses_to_start():
    result = run_manage("check", ALLOWED_HOSTS="cp.example.com")
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr and "cp.example.com" in result.stderr


@pytest.mark.subprocess  # runs manage.py
def test_unreadable_secret_file_is_a_clear_error():
    result = run_manage("check", SECRET_KEY_FILE="/nonexistent/secret")
    assert result.returncode != 0 and "SECRET_KEY_FILE" in result.stderr


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("0", False), ("", False)])
def test_env_bool(monkeypatch, raw, expected):
    from controlplane.env import env_bool

    monkeypatch.setenv("FLAG", raw)
    assert env_bool("FLAG") is expected


def test_env_bool_rejects_nonsense(monkeypatch):
    from django.core.exceptions import ImproperlyConfigured

    from controlplane.env import env_bool

    monkeypatch.setenv("FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="FLAG"):
        env_bool("FLAG")


def _shell(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.subprocess  # runs manage.py
def test_without_redis_every_process_shares_the_rate_limit_counters(tmp_path):
    """`serve` runs two web workers: a counter written by one process is seen by another."""
    var = {"CONTROLPLANE_VAR_DIR": str(tmp_path)}
    _shell("from django.core.cache import cache; cache.set('throttle:probe', [1, 2, 3], 60)", **var)
    seen = _shell("from django.core.cache import cache; print(cache.get('throttle:probe'))", **var)
    assert seen == "[1, 2, 3]"


@pytest.mark.subprocess  # runs manage.py
def test_redis_is_the_cache_whenever_it_is_configured(tmp_path):
    code = "from django.conf import settings; print(settings.CACHES['default']['BACKEND'])"
    backend = _shell(code, REDIS_URL="redis://127.0.0.1:6379/3", CONTROLPLANE_VAR_DIR=str(tmp_path))
    assert backend == "django.core.cache.backends.redis.RedisCache"
