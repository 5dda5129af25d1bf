"""Retrieval indexes: a tenant's documents and their vectors, searched by its pipelines' retrieve stages.
Every change moves the index's revision (a compare-and-set on it), so gateways fetch it again."""

import math
from typing import Any

from django.db import transaction
from django.db.models import F

from core.choices import Scope
from core.errors import NotFound, ValidationFailed
from core.models import Tenant
from core.principal import Principal
from core.services.audit import audit_record, create_audited
from core.services.validation import full_clean
from registry.models import IndexDocument, RetrievalIndex

MAX_DOCUMENTS = 10_000  # a small index: searched exactly, in memory, by every gateway that runs it
MAX_PER_CALL = 500
MAX_NUMBERS = 4_000_000  # documents × dimensions: 10,000 × 384, or 1,000 × 4,096 (16 MB of float32)


def index_create(*, actor: Principal, owner: Tenant, name: str, dimensions: int) -> RetrievalIndex:
    actor.require(Scope.REGISTRY_WRITE, owner.pk)
    index = RetrievalIndex(owner=owner, name=name, dimensions=dimensions, created_by_name=actor.name)
    full_clean(index, exclude=["owner"])
    return create_audited(
        actor=actor,
        instance=index,
        action="index.created",
        tenant=owner,
        after={"name": name, "dimensions": dimensions},
        taken=f"Index {owner.slug}/{name} already exists.",
    )


def documents_put(*, actor: Principal, index: RetrievalIndex, documents: list[dict[str, Any]]) -> int:
    """Add or replace documents by key (all or none); the index's new revision."""
    actor.require(Scope.REGISTRY_WRITE, index.owner_id)
    if not 1 <= len(documents) <= MAX_PER_CALL:
        raise ValidationFailed(
            f"Send 1 to {MAX_PER_CALL} documents at a time.", detail={"documents": ["Size."]}
        )
    for n, document in enumerate(documents):
        _check_vector(document["vector"], index.dimensions, f"documents[{n}].vector")
    keys = [d["key"] for d in documents]
    if len(set(keys)) != len(keys):
        raise ValidationFailed("Two documents have the same key.", detail={"documents": ["Duplicate keys."]})
    with transaction.atomic():
        locked = RetrievalIndex.objects.select_for_update().get(pk=index.pk)
        existing = set(locked.documents.filter(key__in=keys).values_list("key", flat=True))
        total = locked.documents.count() + len(set(keys) - existing)
        if total > MAX_DOCUMENTS or total * locked.dimensions > MAX_NUMBERS:
            most = min(MAX_DOCUMENTS, MAX_NUMBERS // locked.dimensions)
            raise ValidationFailed(
                f"An index of {locked.dimensions} dimensions holds at most {most} documents."
            )
        IndexDocument.objects.filter(index=locked, key__in=existing).delete()
        IndexDocument.objects.bulk_create(
            [IndexDocument(index=locked, key=d["key"], text=d["text"], vector=d["vector"]) for d in documents]
        )
        return _changed(actor, locked, "index.documents_put", {"keys": keys[:50], "count": len(keys)})


def document_delete(*, actor: Principal, index: RetrievalIndex, key: str) -> int:
    actor.require(Scope.REGISTRY_WRITE, index.owner_id)
    with transaction.atomic():
        locked = RetrievalIndex.objects.select_for_update().get(pk=index.pk)
        deleted, _ = locked.documents.filter(key=key).delete()
        if not deleted:
            raise NotFound(f"No document '{key}' in {index}.")
        return _changed(actor, locked, "index.document_deleted", {"key": key})


def _changed(actor: Principal, index: RetrievalIndex, action: str, after: dict[str, Any]) -> int:
    RetrievalIndex.objects.filter(pk=index.pk).update(revision=F("revision") + 1)
    index.refresh_from_db(fields=["revision"])
    audit_record(actor=actor, action=action, target=index, tenant=index.owner, after=after)
    return index.revision


def _number(x: Any) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    return isinstance(x, int) and not isinstance(x, bool) and abs(x) <= 2**53


def _check_vector(vector: Any, dimensions: int, where: str) -> None:
    if not isinstance(vector, list) or len(vector) != dimensions:
        raise ValidationFailed(f"{where}: must be {dimensions} numbers.", detail={where: ["Wrong length."]})
    if not all(_number(x) for x in vector):
        raise ValidationFailed(f"{where}: must be finite numbers.", detail={where: ["Not numbers."]})
