"""The shared fixture world: two tenants with different residency, their people, and platform staff.

Every isolation test asks the same question: can someone of tenant A see or change tenant B's things?
"""

import os
from collections.abc import Callable, Iterator
from datetime import datetime

import pytest
import time_machine
from rest_framework.test import APIClient

from core.choices import PlatformRole, TenantRole
from core.models import User
from tests.support.factories import MembershipFactory, ServiceAccountFactory, TenantFactory, UserFactory
from tests.support.principals import World, mint, principal
from tests.support.processes import child_env
from tests.support.prometheus import prometheus  # noqa: F401  (a fixture)
from tests.support.redis import redis_url  # noqa: F401  (a fixture)
from tests.support.regions import make_region, tiny_model_dir  # noqa: F401  (fixtures of every capability)
from tests.support.registry import POLICY
from tests.support.tiers import is_unit


def pytest_configure(config: pytest.Config) -> None:
    from django.conf import settings

    # Password hashing is deliberately slow; the suite creates many users.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    # Most tests register versions whose URIs point nowhere; ingest is tested on its own.
    settings.ARTIFACT_INGEST_ON_REGISTER = False
    # Tests' models live in temporary folders and their sources in local S3 and HTTP servers: every source
    # is allowed here (and in the processes tests start); tests/registry/test_sources.py narrows the list.
    os.environ["ARTIFACT_SOURCES"] = "file:///,s3://,http://,https://"
    settings.ARTIFACT_SOURCES = os.environ["ARTIFACT_SOURCES"].split(",")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects, so that ``-m unit`` sees the mark
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``unit`` every test that needs no database, server, process or browser: ``make test-unit``."""
    for item in items:
        if is_unit(item):
            item.add_marker(pytest.mark.unit)


@pytest.fixture(autouse=True)
def _fresh_cache() -> None:
    """Rate-limit counters live in the cache (Redis in CI); each test starts with none."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def _own_audit_checkpoints(settings, tmp_path) -> None:
    """Audit checkpoints live outside the database; each test's database gets its own, fresh log."""
    settings.AUDIT_CHECKPOINT_DIR = str(tmp_path / "audit-checkpoints")
    settings.AUDIT_CHECKPOINT_KEY_FILE = str(tmp_path / "audit-checkpoint.key")
    settings.AUDIT_CHECKPOINT_KEY_GENERATE = True


@pytest.fixture(autouse=True)
def _wall_clock() -> Iterator[None]:
    """``TEST_CLOCK=2026-12-01T00:30Z`` starts every test's wall clock at that instant (ticking on), to show
    that no test depends on the day or the hour: the first hours of a month, the last minute of February."""
    start = os.environ.get("TEST_CLOCK", "")
    if not start:
        yield
        return
    with time_machine.travel(datetime.fromisoformat(start.replace("Z", "+00:00")), tick=True):
        yield


@pytest.fixture
def world(db: None) -> World:
    tenant_a = TenantFactory(slug="acme", residency=["EU", "CH"])
    tenant_b = TenantFactory(slug="globex", residency=["US"])
    alice = MembershipFactory(tenant=tenant_a, role=TenantRole.ADMIN, user__username="alice").user
    dave = MembershipFactory(tenant=tenant_a, role=TenantRole.DEVELOPER, user__username="dave").user
    vera = MembershipFactory(tenant=tenant_a, role=TenantRole.VIEWER, user__username="vera").user
    bob = MembershipFactory(tenant=tenant_b, role=TenantRole.ADMIN, user__username="bob").user
    return World(
        tenant_a=tenant_a,
        tenant_b=tenant_b,
        alice=alice,
        dave=dave,
        vera=vera,
        bob=bob,
        admin=UserFactory(username="root", platform_role=PlatformRole.ADMIN),
        operator=UserFactory(username="ops", platform_role=PlatformRole.OPERATOR),
        auditor=UserFactory(username="audrey", platform_role=PlatformRole.AUDITOR),
        robot_a=ServiceAccountFactory(tenant=tenant_a, name="ci", role=TenantRole.DEVELOPER),
        robot_b=ServiceAccountFactory(tenant=tenant_b, name="ci", role=TenantRole.DEVELOPER),
    )


@pytest.fixture
def api() -> Callable[..., APIClient]:
    """api(user) → a client authenticated with a fresh token of that user; api() → anonymous."""

    def make(
        user: User | None = None, scopes: list[str] | None = None, secret: str | None = None
    ) -> APIClient:
        client = APIClient()
        if user is not None or secret is not None:
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret or mint(user, scopes)}")  # type: ignore[arg-type]
        return client

    return make


@pytest.fixture
def celery_worker(transactional_db: None, tmp_path):  # type: ignore[no-untyped-def]
    """A real Celery worker process on the configured broker, consuming a queue private to this test."""
    import subprocess
    import sys
    import uuid

    from controlplane.celery import app

    queue = f"test-{uuid.uuid4().hex[:8]}"
    previous = app.conf.task_default_queue
    app.conf.task_default_queue = queue
    log = (tmp_path / "worker.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "controlplane",
            "worker",
            "-Q",
            queue,
            "--pool",
            "solo",
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        env=child_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    yield proc
    proc.terminate()
    proc.wait(timeout=20)
    app.conf.task_default_queue = previous
    log.close()


@pytest.fixture
def chat_model(world: World):  # type: ignore[no-untyped-def]
    """Tenant A's private 8B chat model with the standard validation policy (tests/registry)."""
    from registry.services.models import model_register

    return model_register(
        actor=principal(world.alice),
        owner=world.tenant_a,
        name="llama-3-8b",
        task="chat",
        validation_policy=POLICY,
    )
