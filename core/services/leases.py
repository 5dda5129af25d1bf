"""Leader election through the database, so two of every process can run and exactly one is active.

A lease is a row (``core.models.Lease``) taken or renewed by one conditional ``UPDATE``: it succeeds for
the process that holds it, or for anyone once it has expired, and PostgreSQL's row lock makes two
processes racing for an expired lease see one winner. A holder renews every round (well before expiry);
one that dies stops renewing, and a standby takes over within ``seconds``. A holder that stops cleanly
releases it, so the standby takes over at its next round.
"""

import logging
import os
import socket
import threading
import uuid
from datetime import datetime, timedelta

from django.db import DatabaseError, IntegrityError, connections, transaction
from django.db.models import Q
from django.utils import timezone

from core.models import Lease

log = logging.getLogger(__name__)


def holder_name(role: str) -> str:
    """A name unique to this process (hosts, restarts and threads apart), readable in the lease table."""
    return f"{role}@{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def lease_hold(name: str, holder: str, seconds: float, now: datetime | None = None) -> bool:
    """Take or renew the lease ``name`` for ``holder`` until ``now + seconds``: True while it is theirs."""
    now = now or timezone.now()
    until = now + timedelta(seconds=seconds)
    if Lease.objects.filter(name=name, holder=holder).update(expires_at=until):
        return True
    if Lease.objects.filter(Q(name=name) & Q(expires_at__lte=now)).update(
        holder=holder, acquired_at=now, expires_at=until
    ):
        return True
    try:
        with transaction.atomic():
            Lease.objects.create(name=name, holder=holder, acquired_at=now, expires_at=until)
    except IntegrityError:  # held by another, or taken by another this instant
        return False
    return True


def lease_release(name: str, holder: str, now: datetime | None = None) -> None:
    """Give the lease up now (a clean stop): the next process to ask gets it."""
    Lease.objects.filter(name=name, holder=holder).update(expires_at=now or timezone.now())


def lease_release_on_stop(name: str, holder: str, wait: float = 5.0) -> None:
    """``lease_release`` for a process that is stopping (a SIGTERM handler, a ``finally`` it unwound to):
    it may have been stopped inside a query on this thread's connection, which that query left busy (and
    psycopg's connection lock is not re-entrant), so release on a connection of its own, for ``wait``
    seconds at most. Past that, or on a database error, the lease simply runs out as after a kill."""
    releaser = threading.Thread(target=_release_on_own_connection, args=(name, holder), daemon=True)
    releaser.start()
    releaser.join(wait)
    if releaser.is_alive():
        log.warning("%s did not release the %s lease within %ss; it runs out instead", holder, name, wait)


def _release_on_own_connection(name: str, holder: str) -> None:
    try:
        lease_release(name, holder)
    except DatabaseError:
        log.exception("%s could not release the %s lease; it runs out instead", holder, name)
    finally:
        connections.close_all()


def lease_holder(name: str, now: datetime | None = None) -> str:
    """Who holds ``name`` now ('' when nobody does)."""
    lease = Lease.objects.filter(name=name, expires_at__gt=now or timezone.now()).first()
    return lease.holder if lease else ""
