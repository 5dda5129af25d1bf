"""Celery entry points of the reconciler."""

from celery import shared_task
from django.core.cache import cache

from regions import reconciler


@shared_task(name="regions.tasks.reconcile_region")
def reconcile_region(region_id: int, unsettled_only: bool = False) -> int:
    """A pass over the region's due targets. While an engine there is starting, come back when it is due
    (a quarter of a second) rather than at the next periodic pass: a request may be held at a gateway for
    it. Such a follow-up looks only at targets not yet settled (the periodic pass surveys the ready ones).
    One follow-up per region at a time (a cache key), however many passes ran."""
    soon = f"regions:reconcile-soon:{region_id}"
    cache.delete(soon)  # this pass is the follow-up (or makes it unneeded): the next one may be planned
    count = reconciler.reconcile_region(region_id, unsettled_only)
    due = reconciler.starting_due_in(region_id)
    if due is not None and due < reconciler.RESYNC.total_seconds() and cache.add(soon, "1", timeout=60):
        reconcile_region.apply_async((region_id, True), countdown=due)
    return count


@shared_task(name="regions.tasks.reconcile_all")
def reconcile_all() -> None:
    """The periodic pass: one reconcile task per region, so regions converge in parallel."""
    for region_id in reconciler.region_ids():
        reconcile_region.delay(region_id)
