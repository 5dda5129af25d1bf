"""The autoscaler's Celery entry point, run by beat every AUTOSCALE_INTERVAL_SECONDS (15 by default)."""

import logging

from celery import shared_task
from django.core.cache import cache
from django.utils import timezone

from autoscaling import evaluator

log = logging.getLogger(__name__)
LOCK = "autoscaling:pass"
LOCK_SECONDS = 120  # a pass killed midway frees the fleet after this; a normal pass takes well under


@shared_task(name="autoscaling.tasks.evaluate_all")
def evaluate_all() -> dict[str, int]:
    """One pass over the fleet; skipped while another runs (two passes would both scale from the same
    replicas). Killed midway, the next pass starts over: decisions are recomputed from the database."""
    if not cache.add(LOCK, "1", timeout=LOCK_SECONDS):
        return {"skipped": 1}
    try:
        report = evaluator.evaluate_all(now=timezone.now())
    finally:
        cache.delete(LOCK)
    for line in report.scaled:
        log.info("autoscaler: %s", line)
    return {"deployments": report.deployments, "targets": report.targets, "scaled": len(report.scaled)}
