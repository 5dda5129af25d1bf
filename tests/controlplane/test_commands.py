"""Management commands for automation, and the demo world."""

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from django.core.management import CommandError, call_command

from core.models import AuditEvent, Membership, Tenant, User
from core.services.tokens import token_authenticate
from tests.support.processes import child_env, wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_create_tenant_and_user(db, monkeypatch):
    call_command("create_tenant", "helvetia", "--name", "Helvetia", "--residency", "CH,EU", "--max-gpus", "4")
    tenant = Tenant.objects.get(slug="helvetia")
    assert tenant.residency == ["CH", "EU"] and tenant.max_gpus == 4
    monkeypatch.setenv("CONTROLPLANE_PASSWORD", "a-long-enough-password-42")
    call_command("create_user", "heidi", "--member", "helvetia:admin")
    heidi = User.objects.get(username="heidi")
    assert heidi.check_password("a-long-enough-password-42")
    assert Membership.objects.get(user=heidi).role == "admin"
    event = AuditEvent.objects.get(action="tenant.created")
    assert event.source == "command" and event.actor_type == "system"


def test_commands_report_bad_input_without_writing(db):
    with pytest.raises(CommandError, match="XX"):
        call_command("create_tenant", "bad", "--name", "Bad", "--residency", "EU,XX")
    with pytest.raises(CommandError, match="nowhere"):
        call_command("create_user", "ghost", "--member", "nowhere:admin")
    assert not Tenant.objects.filter(slug="bad").exists()
    assert not User.objects.filter(username="ghost").exists()


def test_seed_demo_is_idempotent(db, settings, tmp_path):
    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    counts = (
        Tenant.objects.count(),
        User.objects.count(),
        Membership.objects.count(),
        AuditEvent.objects.count(),
    )
    call_command("seed_demo")
    assert (
        Tenant.objects.count(),
        User.objects.count(),
        Membership.objects.count(),
        AuditEvent.objects.count(),
    ) == counts
    eu, us = Tenant.objects.get(slug="acme-eu"), Tenant.objects.get(slug="globex-us")
    assert eu.residency == ["EU", "CH"] and us.residency == ["US"]
    assert Membership.objects.get(user__username="eu-admin").tenant == eu
    assert User.objects.get(username="operator").platform_role == "operator"
    # Tokens for the local gateway and for each demo tenant's app, kept across re-seeds; a token file from
    # another database is replaced.
    (tmp_path / "tokens" / "globex-us").write_text("cpt_0000_unknown\n")
    call_command("seed_demo")
    assert token_authenticate((tmp_path / "tokens" / "globex-us").read_text().strip())
    gateway = token_authenticate((tmp_path / "tokens" / "gateway").read_text().strip())
    app = token_authenticate((tmp_path / "tokens" / "acme-eu").read_text().strip())
    assert gateway.scopes == ["gateway:sync"] and gateway.service_account.tenant is None
    assert app.scopes == ["models:invoke"] and app.service_account.tenant == eu


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_serve_runs_web_worker_and_scheduler_and_stops_them_on_ctrl_c(transactional_db, tmp_path):
    # Seeded by a child process so passwords use the production hasher, not the suite's fast one.
    subprocess.run(
        # The simulator: the seeded acme-eu/chat deployment must not start a real vLLM engine here.
        [sys.executable, "manage.py", "seed_demo", "--engine", "simulator"],
        cwd=ROOT,
        env=child_env(CONTROLPLANE_VAR_DIR=str(tmp_path)),
        check=True,
        timeout=120,
    )
    port, gateway_port = free_port(), free_port()
    home = tmp_path / "home"  # an empty HOME: serve keeps its state under var/, never in ~ (~/.gunicorn)
    home.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "serve",
            "--bind",
            f"127.0.0.1:{port}",
            "--web-workers",
            "1",
            "--gateway-port",
            str(gateway_port),
        ],
        cwd=ROOT,
        env=child_env(CONTROLPLANE_VAR_DIR=str(tmp_path), HOME=str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return requests.get(f"{base}/readyz", timeout=10).status_code == 200
            except requests.RequestException:  # not listening yet, or still importing the app
                return False

        wait_for(up, timeout=60)
        session = requests.Session()
        login = session.get(f"{base}/login/", timeout=5)
        assert login.status_code == 200
        response = session.post(
            f"{base}/login/",
            data={
                "username": "eu-admin",
                "password": "inference-demo-2026",
                "csrfmiddlewaretoken": session.cookies["csrftoken"],
            },
            headers={"Referer": f"{base}/login/"},
            timeout=10,
        )
        assert response.status_code == 200 and "acme-eu" in session.get(f"{base}/tenants/", timeout=5).text
        children = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        assert len(children) == 5  # web, worker, beat, router, gateway
        # A demo tenant calls the gateway with the token seed_demo left for it.
        token = (tmp_path / "tokens" / "acme-eu").read_text().strip()

        def models() -> requests.Response | None:
            try:
                reply = requests.get(
                    f"http://127.0.0.1:{gateway_port}/v1/models",
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=5,
                )
            except requests.RequestException:
                return None
            return reply if reply.status_code != 503 else None  # 503: no route table fetched yet

        listed = wait_for(models, timeout=60)
        assert listed.status_code == 200 and listed.json()["object"] == "list"
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, output
    assert "Demo password" in output and "Stopped web, worker, scheduler, router and gateway." in output
    assert "superuser privileges" not in output  # Celery's root warning, silenced for the demo worker only
    assert not list(home.iterdir()), list(home.iterdir())
    for child in children:
        assert not Path(f"/proc/{child}").exists() or _is_zombie(child), (
            f"process {child} still running: {_cmdline(child)}"
        )


def _is_zombie(pid: str) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"
