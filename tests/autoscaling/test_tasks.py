"""The beat task: one pass over the fleet at the current time, skipped while another pass holds the lock."""

import pytest
import time_machine
from django.core.cache import cache

from autoscaling import tasks
from tests.support.autoscaling import NOW, autoscale, deploy, replicas, serve
from tests.support.principals import principal
from tests.support.regions import tiny_version

pytestmark = pytest.mark.django_db


@pytest.fixture
def chat(world, make_region, tiny_model_dir):  # type: ignore[no-untyped-def]
    make_region("eu-west-1", "EU", gpus=8)
    alice = principal(world.alice)
    deployment = deploy(alice, tiny_version(alice, tiny_model_dir, owner=world.tenant_a), ["eu-west-1"])
    autoscale(alice, deployment, running=4)
    serve(deployment, "eu-west-1", running=12)
    return deployment


def test_the_task_runs_one_pass_at_the_current_time_and_frees_its_lock(chat):
    with time_machine.travel(NOW, tick=False):
        assert tasks.evaluate_all() == {"deployments": 1, "targets": 1, "scaled": 1}
    assert replicas(chat) == {"eu-west-1": 3}
    assert cache.get(tasks.LOCK) is None


def test_a_pass_is_skipped_while_another_one_runs(chat):
    cache.add(tasks.LOCK, "1", timeout=tasks.LOCK_SECONDS)  # another worker is inside its pass
    with time_machine.travel(NOW, tick=False):
        assert tasks.evaluate_all() == {"skipped": 1}
    assert replicas(chat) == {"eu-west-1": 1}
