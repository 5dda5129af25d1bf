"""The built wheel is the product: installed into a fresh venv (no checkout on the path) it must give a
working control plane and gateway, and building it must not print deprecation banners."""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow
BUILD_LITTER = (".git", ".venv", "var", "build", "*.egg-info", "__pycache__", ".*_cache", "test-artifacts")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{cmd} exited {done.returncode}\n{output[-6000:]}"
    return output


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], str]:
    tmp = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the sources, as from a fresh clone: no stale build/ or egg-info of the checkout.
    source = tmp / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=shutil.ignore_patterns(*BUILD_LITTER))
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp), "."],
        cwd=source,
    )
    (wheel,) = tmp.glob("controlplane-*.whl")
    venv = tmp / "venv"
    # Nothing of the checkout is visible: no PYTHONPATH (pip would take the checkout's egg-info for an
    # installed controlplane), cwd outside the repository, the local defaults (no services).
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "DJANGO_SETTINGS_MODULE"}}
    for name in ("DATABASE_URL", "CELERY_BROKER_URL", "REDIS_URL"):
        env.pop(name, None)
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        CONTROLPLANE_VAR_DIR=str(tmp / "var"),
        PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
    )
    _run([sys.executable, "-m", "venv", str(venv)], env=env)
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "--quiet"]
    _run([*pip, "-c", str(REPO / "constraints.txt"), str(wheel)], cwd=tmp, env=env)
    return venv, env, built


def test_building_the_wheel_prints_no_deprecation_banner(installed: tuple[Path, dict[str, str], str]) -> None:
    _, _, build_output = installed
    assert "Deprecat" not in build_output and "SPDX" not in build_output, build_output


def test_the_installed_control_plane_checks_migrates_and_serves_the_console(
    installed: tuple[Path, dict[str, str], str], tmp_path: Path
) -> None:
    venv, env, _ = installed
    django_admin = str(venv / "bin/django-admin")
    _run([django_admin, "check", "--settings", "controlplane.settings"], cwd=tmp_path, env=env)
    _run([django_admin, "migrate", "--no-input"], cwd=tmp_path, env=env)
    _run([django_admin, "seed_demo"], cwd=tmp_path, env=env)  # the demo world, from the wheel alone
    _run([str(venv / "bin/python"), "-m", "pip", "check"], cwd=tmp_path, env=env)
    probe = (
        "import django, controlplane; django.setup()\n"
        "assert '/site-packages/' in controlplane.__file__, controlplane.__file__\n"
        "from django.test import Client\n"
        "from django.contrib.staticfiles import finders\n"
        "import gateway, routing, rollouts, autoscaling, artifacts, regions, registry, billing\n"
        "assert finders.find('controlplane/console.css'), 'static files missing'\n"
        "page = Client(HTTP_HOST='localhost').get('/login/')\n"
        "assert page.status_code == 200, page.status_code\n"
        "assert b'password' in page.content.lower()\n"
        "from django.core.management import get_commands\n"
        "assert {'serve', 'seed_demo', 'route', 'verify_audit'} <= set(get_commands()), get_commands()\n"
        "print('ok')\n"
    )
    out = _run([str(venv / "bin/python"), "-c", probe], cwd=tmp_path, env=env)
    assert out.strip().endswith("ok"), out


def test_the_installed_gateway_starts_and_answers_healthz(
    installed: tuple[Path, dict[str, str], str], tmp_path: Path
) -> None:
    venv, env, _ = installed
    port = _free_port()
    # No control plane is listening there: the gateway still starts and reports itself alive.
    gateway_env = {**env, "CONTROL_PLANE_URL": f"http://127.0.0.1:{_free_port()}"}
    proc = subprocess.Popen(
        [str(venv / "bin/python"), "-m", "gateway", "--port", str(port)],
        cwd=tmp_path,
        env=gateway_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"gateway exited with {proc.returncode}: {proc.stdout.read()}"  # type: ignore[union-attr]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as reply:
                    assert reply.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "gateway did not answer /healthz within 60 s"
                time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_images_entry_point_runs_from_the_installed_wheel(
    installed: tuple[Path, dict[str, str], str], tmp_path: Path
) -> None:
    """What deploy/Dockerfile's image runs, minus the image: the entry point with the wheel's commands."""
    _, env, _ = installed
    entrypoint = str(REPO / "deploy" / "entrypoint.sh")
    _run(["sh", entrypoint, "migrate"], cwd=tmp_path, env=env)
    _run(["sh", entrypoint, "manage", "check"], cwd=tmp_path, env=env)
    routed = _run(["sh", entrypoint, "router", "--rounds", "1", "--interval", "0"], cwd=tmp_path, env=env)
    assert "Traceback" not in routed, routed
