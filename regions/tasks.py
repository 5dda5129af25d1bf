"""Celery entry points of the reconciler."""

from celery import shared_task

from regions import reconciler


@shared_task(name="regions.tasks.reconcile_region")
def reconcile_region(region_id: int) -> int:
    return reconciler.reconcile_region(region_id)


@shared_task(name="regions.tasks.reconcile_all")
def reconcile_all() -> None:
    reconciler.reconcile_all()


@shared_task(name="regions.tasks.replicate_artifact")
def replicate_artifact(replica_id: int) -> str:
    from regions.artifacts.replication import replicate

    return replicate(replica_id).state


@shared_task(name="regions.tasks.resume_replication")
def resume_replication() -> list[int]:
    from regions.artifacts.replication import resume_replication

    return resume_replication()


@shared_task(name="regions.tasks.collect_artifact_garbage")
def collect_artifact_garbage() -> list[str]:
    from datetime import timedelta

    from django.conf import settings

    from regions.artifacts.services import collect_garbage

    return collect_garbage(timedelta(days=settings.ARTIFACT_RETENTION_DAYS))


@shared_task(name="regions.tasks.ingest_artifact")
def ingest_artifact(version_id: int) -> str:
    from regions.artifacts.ingest import ingest

    return ingest(version_id)
