"""Celery entry points of the reconciler."""

from celery import shared_task

from regions import reconciler


@shared_task(name="regions.tasks.reconcile_region")
def reconcile_region(region_id: int) -> int:
    return reconciler.reconcile_region(region_id)


@shared_task(name="regions.tasks.reconcile_all")
def reconcile_all() -> None:
    reconciler.reconcile_all()
