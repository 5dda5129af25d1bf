"""Celery beat that can run twice: every scheduler replica runs this beat, and only the one holding the
``beat`` lease sends the periodic tasks; a standby takes over within ``LEASE_SECONDS`` of the active one
dying (``core.services.leases``). Set as ``CELERY_BEAT_SCHEDULER``.

A standby that takes over keeps its own record of when each task last ran, so a task due around the
takeover may run once more than its schedule says: the periodic tasks are level-triggered (they look at
the state and act on what is due), so an extra run does nothing twice.
"""

import logging
from typing import Any

from celery.beat import PersistentScheduler
from django.db import DatabaseError, close_old_connections

from core.services.leases import holder_name, lease_hold, lease_release_on_stop

log = logging.getLogger(__name__)
LEASE = "beat"
LEASE_SECONDS = 15.0


class LeaderScheduler(PersistentScheduler):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.holder, self.leading = holder_name("beat"), False
        super().__init__(*args, **kwargs)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        """Send what is due only while holding the lease; ask again well before it would expire."""
        try:
            leading = lease_hold(LEASE, self.holder, LEASE_SECONDS)
        except DatabaseError:  # the database restarted: a new connection next time; standby meanwhile
            log.exception("beat %s could not reach the lease", self.holder)
            close_old_connections()
            leading = False
        if leading != self.leading:
            log.info("beat %s is %s", self.holder, "now active" if leading else "on standby")
            self.leading = leading
        if not leading:
            return LEASE_SECONDS / 3
        return min(float(super().tick(*args, **kwargs)), LEASE_SECONDS / 3)

    def close(self) -> None:
        # Celery calls this from its SIGTERM handler, wherever the main thread is: maybe inside a query.
        if self.leading:
            lease_release_on_stop(LEASE, self.holder)
            self.leading = False
        super().close()
