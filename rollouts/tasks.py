"""Celery entry points of the rollout controller: on change (enqueued by the services) and by beat."""

from celery import shared_task

from rollouts import controller


@shared_task(name="rollouts.tasks.advance_rollout")
def advance_rollout(rollout_id: int) -> str:
    return controller.advance(rollout_id)


@shared_task(name="rollouts.tasks.advance_all")
def advance_all() -> None:
    """The periodic pass: every rollout that is not finished gets one pass."""
    for rollout_id in controller.due_rollouts():
        advance_rollout.delay(rollout_id)
