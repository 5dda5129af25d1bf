"""Reads of artifact replicas: the versions × regions matrix a principal may see, and storage used."""

from typing import Any

from django.db.models import QuerySet

from artifacts.drivers.stores import store_from_config
from artifacts.models import ArtifactReplica
from core.errors import NotFound
from core.principal import Principal
from regions import selectors as region_selectors
from registry.selectors import models_for


def replicas_for(principal: Principal) -> QuerySet[ArtifactReplica]:
    return ArtifactReplica.objects.filter(version__model__in=models_for(principal)).select_related(
        "version__model__owner", "region"
    )


def replica_get(principal: Principal, pk: int) -> ArtifactReplica:
    replica = replicas_for(principal).filter(pk=pk).first()
    if replica is None:
        raise NotFound(f"No artifact replica {pk}.")
    return replica


def matrix(replicas: QuerySet[ArtifactReplica]) -> dict[str, Any]:
    """{"regions": [...], "rows": [{"version": "acme/llama@1.0.0", "cells": {region: replica}}]}."""
    regions: list[str] = sorted({r.region.code for r in replicas})
    rows: dict[str, dict[str, ArtifactReplica]] = {}
    for replica in replicas:
        rows.setdefault(str(replica.version), {})[replica.region.code] = replica
    return {"regions": regions, "rows": [{"version": v, "cells": cells} for v, cells in sorted(rows.items())]}


def storage_used(principal: Principal) -> dict[str, int]:
    """Bytes of model weights held in the object store of each region the principal sees (read from the
    stores themselves); callers check that the principal may see it (operators)."""
    regions = region_selectors.regions_for(principal).exclude(object_store={})
    return {r.code: store_from_config(r.object_store).usage_bytes() for r in regions}
