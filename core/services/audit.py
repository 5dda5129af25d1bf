"""The tamper-evident audit chain: one writer function for the whole platform, and its verifier."""

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC
from typing import Any, TypeVar

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, models, transaction
from django.utils import timezone

from core.errors import Conflict
from core.models import AuditChainHead, AuditEvent, Tenant
from core.observability import current_request_id
from core.principal import Principal
from core.services.audit_checkpoints import Checkpoint

M = TypeVar("M", bound=models.Model)

GENESIS_HASH = "0" * 64
# The columns each hash format covers. A format is frozen once events were written with it: a new or
# newly hashed column means a new version here (a test checks the current one covers every column).
_FORMAT_1 = (
    "seq",
    "occurred_at",
    "actor_type",
    "actor_id",
    "actor_name",
    "token_prefix",
    "tenant_slug",
    "action",
    "target_type",
    "target_id",
    "target_repr",
    "before",
    "after",
    "request_id",
    "source",
    "message",
    "prev_hash",
)
HASHED_FIELDS: dict[int, tuple[str, ...]] = {
    1: _FORMAT_1,  # events written before migration 0008_auditevent_hash_version: no tenant_id
    2: (*_FORMAT_1, "tenant_id", "hash_version"),
}
HASH_VERSION = 2
# Columns no format covers: the row id is storage only (order and identity are seq), hash is the result.
UNHASHED_FIELDS = frozenset({"id", "hash"})


def jsonable(value: Any) -> Any:
    """The value as it will read back from a JSON column (decimals, dates and UUIDs become strings)."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def snapshot(instance: models.Model, fields: Iterable[str]) -> dict[str, Any]:
    return jsonable({name: getattr(instance, name) for name in fields})


def event_hash(event: AuditEvent) -> str:
    """SHA-256 over the columns that the event's hash format covers (KeyError for an unknown format)."""
    values = {name: getattr(event, name) for name in HASHED_FIELDS[event.hash_version]}
    values["occurred_at"] = event.occurred_at.astimezone(UTC).isoformat()
    canonical = json.dumps(values, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _locked_head() -> AuditChainHead:
    head = AuditChainHead.objects.select_for_update().filter(pk=1).first()
    if head is None:  # a flushed database (tests) or a fresh one created without migrations' data
        AuditChainHead.objects.get_or_create(pk=1, defaults={"seq": 0, "hash": GENESIS_HASH})
        head = AuditChainHead.objects.select_for_update().get(pk=1)
    return head


@dataclass(frozen=True)
class AuditEntry:
    """One event to append (``audit_record_many``)."""

    actor: Principal
    action: str
    target: models.Model | None = None
    tenant: Tenant | None = None
    before: Any = None
    after: Any = None
    message: str = ""


def audit_record(
    *,
    actor: Principal,
    action: str,
    target: models.Model | None = None,
    tenant: Tenant | None = None,
    before: Any = None,
    after: Any = None,
    message: str = "",
) -> AuditEvent:
    """Append one event to the chain, inside the caller's transaction."""
    entry = AuditEntry(actor, action, target, tenant, before, after, message)
    return audit_record_many([entry])[0]


def audit_record_many(entries: Sequence[AuditEntry]) -> list[AuditEvent]:
    """Append events to the chain in order, inside the caller's transaction, under one acquisition of the
    chain head's lock (a reconcile pass appends its status changes together, not one lock each).

    The chain head row is locked first, so parallel writers append one after another and never fork
    the chain; the lock is held only until the caller's transaction commits.
    """
    if not entries:
        return []
    with transaction.atomic():
        head = _locked_head()
        events, seq, prev_hash = [], head.seq, head.hash
        for entry in entries:
            seq += 1
            event = _event(entry, seq, prev_hash)
            events.append(event)
            prev_hash = event.hash
        AuditEvent.objects.bulk_create(events)
        AuditChainHead.objects.filter(pk=1).update(seq=seq, hash=prev_hash)
    return events


def _event(entry: AuditEntry, seq: int, prev_hash: str) -> AuditEvent:
    target, tenant, actor = entry.target, entry.tenant, entry.actor
    event = AuditEvent(
        seq=seq,
        occurred_at=timezone.now(),
        actor_type=actor.kind,
        actor_id=actor.actor_id,
        actor_name=actor.name[:200],
        token_prefix=actor.token.prefix if actor.token else "",
        tenant=tenant,
        tenant_slug=tenant.slug if tenant else "",
        action=entry.action,
        target_type=target._meta.label_lower if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:300] if target is not None else "",
        before=jsonable(entry.before),
        after=jsonable(entry.after),
        request_id=current_request_id(),
        source=actor.source,
        message=entry.message,
        prev_hash=prev_hash,
        hash_version=HASH_VERSION,
    )
    event.hash = event_hash(event)
    return event


@dataclass(frozen=True)
class ChainReport:
    """What verification found; ``checkpoint`` is the newest signed checkpoint the chain was held to."""

    ok: bool
    checked: int
    head_seq: int
    first_broken_seq: int | None = None
    reason: str = ""
    head_hash: str = GENESIS_HASH
    checkpoint: dict[str, Any] | None = None
    checkpoint_written: dict[str, Any] | None = None
    warning: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _broken_link(event: AuditEvent, expected_seq: int, prev_hash: str, prev_version: int) -> str:
    if event.seq != expected_seq:
        return f"event #{expected_seq} is missing (found #{event.seq} next)"
    if event.prev_hash != prev_hash:
        return f"event #{event.seq} does not link to the event before it"
    if event.hash_version not in HASHED_FIELDS:
        return f"event #{event.seq} claims hash format {event.hash_version}, which does not exist"
    if event.hash_version < prev_version:
        version = event.hash_version
        return f"event #{event.seq} uses hash format {version} after format {prev_version}: rewritten"
    return ""


def _altered(event: AuditEvent, tenant_slugs: dict[int, str]) -> str:
    if event.hash != event_hash(event):
        return f"event #{event.seq} was altered after it was written (its hash does not match its content)"
    # Format 1 did not hash tenant_id; tenant slugs never change, so the hashed slug pins the tenant.
    if event.hash_version == 1 and tenant_slugs.get(event.tenant_id or 0, "") != event.tenant_slug:
        return f"event #{event.seq} was moved to another tenant (its tenant does not match its hashed slug)"
    return ""


def _unlike_checkpoint(event: AuditEvent, anchors: dict[int, list[Checkpoint]]) -> str:
    for checkpoint in anchors.get(event.seq, ()):
        if checkpoint.hash != event.hash:
            at = checkpoint.at.isoformat()
            return f"event #{event.seq} differs from the signed checkpoint of {at}: the chain was rewritten"
    return ""


def _beyond_end(checked: int, checkpoints: Sequence[Checkpoint]) -> str:
    latest = max(checkpoints, key=lambda cp: cp.seq, default=None)
    if latest is None or latest.seq <= checked:
        return ""
    at, seq = latest.at.isoformat(), latest.seq
    return (
        f"the chain ends at #{checked} but the signed checkpoint of {at} records #{seq}: events were removed"
    )


def verify_chain(*, checkpoints: Sequence[Checkpoint] = ()) -> ChainReport:
    """Recompute every link from the first event; report the first one that does not hold.

    Each signed checkpoint must name an event of the chain with the same hash, and the chain must
    reach the newest one: that is what reveals deleted newest events behind a rewound head row.
    """
    head = AuditChainHead.objects.filter(pk=1).first() or AuditChainHead(seq=0, hash=GENESIS_HASH)
    tenant_slugs = dict(Tenant.objects.values_list("id", "slug"))
    anchors: dict[int, list[Checkpoint]] = {}
    for checkpoint in checkpoints:
        anchors.setdefault(checkpoint.seq, []).append(checkpoint)
    prev_hash, prev_version, expected_seq, checked = GENESIS_HASH, 1, 1, 0
    for event in AuditEvent.objects.order_by("seq").iterator(chunk_size=2000):
        reason = (
            _broken_link(event, expected_seq, prev_hash, prev_version)
            or _altered(event, tenant_slugs)
            or _unlike_checkpoint(event, anchors)
        )
        if reason:
            return ChainReport(False, checked, head.seq, min(expected_seq, event.seq), reason)
        prev_hash, prev_version = event.hash, event.hash_version
        expected_seq, checked = expected_seq + 1, checked + 1
    if head.seq != checked or head.hash != prev_hash:
        reason = f"the chain ends at #{checked} but its head records #{head.seq}: events were removed"
        return ChainReport(False, checked, head.seq, checked + 1, reason)
    if reason := _beyond_end(checked, checkpoints):
        return ChainReport(False, checked, head.seq, checked + 1, reason)
    return ChainReport(True, checked, head.seq, head_hash=prev_hash)


def create_audited(
    *, actor: Principal, instance: M, action: str, tenant: Tenant | None, after: dict[str, Any], taken: str
) -> M:
    """Insert a new row and audit it in one transaction; a row that a unique constraint says exists already
    (checked by the database, so two racing creations cannot both pass) is a Conflict saying ``taken``."""
    try:
        with transaction.atomic():
            instance.save()
            audit_record(actor=actor, action=action, target=instance, tenant=tenant, after=after)
    except IntegrityError:
        raise Conflict(taken, code="already_exists") from None
    return instance
