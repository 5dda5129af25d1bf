"""Reads of artifact replicas: the versions × regions matrix a principal may see."""

from typing import Any

from django.db.models import QuerySet

from controlplane.errors import NotFound
from controlplane.principal import Principal
from regions.models import ArtifactReplica
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
