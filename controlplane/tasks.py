"""Periodic jobs that span apps (the project shell may import them all)."""

from celery import shared_task

from regions.services.fleet import placements_follow


@shared_task(name="controlplane.tasks.follow_fleet")
def follow_fleet() -> int:
    """Every minute: re-evaluate policy placements, which also finishes drains whose replacements are
    ready and retires regions a narrowed residency policy no longer allows."""
    return placements_follow("periodic evaluation")
