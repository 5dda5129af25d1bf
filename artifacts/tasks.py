"""Celery entry points of ingest, replication and garbage collection.

The Celery names stay ``regions.tasks.*``, as they were before this app existed: a name is what a queued
message carries, so messages in the broker across an upgrade still find their task.
"""

from datetime import timedelta

from celery import shared_task
from django.conf import settings

from artifacts.services import garbage, ingest, replication


@shared_task(name="regions.tasks.replicate_artifact")
def replicate_artifact(replica_id: int) -> str:
    return replication.replicate(replica_id).state


@shared_task(name="regions.tasks.resume_replication")
def resume_replication() -> list[int]:
    """The periodic pass: one copy task per replica that needs an attempt, deployment waiting or not."""
    due = replication.due_replicas()
    for replica_id in due:
        replicate_artifact.delay(replica_id)
    return due


@shared_task(name="regions.tasks.collect_artifact_garbage")
def collect_artifact_garbage() -> list[str]:
    return garbage.collect_garbage(timedelta(days=settings.ARTIFACT_RETENTION_DAYS))


@shared_task(name="regions.tasks.ingest_artifact")
def ingest_artifact(version_id: int) -> str:
    return ingest.ingest(version_id)
