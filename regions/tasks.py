"""Celery entry points of the reconciler."""

from celery import shared_task

from regions import reconciler


@shared_task(name="regions.tasks.reconcile_region")
def reconcile_region(region_id: int) -> int:
    return reconciler.reconcile_region(region_id)


@shared_task(name="regions.tasks.reconcile_all")
def reconcile_all() -> None:
    """The periodic pass: one reconcile task per region, so regions converge in parallel."""
    for region_id in reconciler.region_ids():
        reconcile_region.delay(region_id)
