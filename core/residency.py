"""Data residency: the one rule for where a model version's weights may be stored and served.

Two policies meet in every decision. A tenant's ``residency`` lists the jurisdictions where its data may be
stored and processed; a model version's ``allowed_jurisdictions`` lists where its weights may go (licence,
export control). The rule:

- stored in a jurisdiction: inside the version's allowed jurisdictions and, for a tenant's private version,
  inside the owning tenant's residency too (its fine-tuned weights are the tenant's data). A platform
  catalog version's weights are shared, so only the version's own list governs where they are stored;
- served to a tenant there: stored there may be, and inside that tenant's residency.

Placement, replication, copy-ahead, garbage collection, routing and the usage check all ask
``residency_refusal``; nothing else compares jurisdictions. Pure and Django-free, so the route computation
(which has no database) calls the same function as the services.
"""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.models import Tenant
    from registry.models import ModelVersion


@dataclass(frozen=True)
class Residency:
    """A tenant's residency policy: where its data may be stored and processed."""

    tenant: str
    jurisdictions: frozenset[str]


@dataclass(frozen=True)
class Weights:
    """What residency needs to know about a model version."""

    version: str  # "acme/llama-3-8b@1.0.0", for messages
    allowed: frozenset[str]  # the version's allowed jurisdictions
    owner: Residency | None  # the owning tenant's policy; None for a platform catalog version


def residency_refusal(weights: Weights, jurisdiction: str, *, serving: Residency | None = None) -> str | None:
    """Why these weights may not be stored in ``jurisdiction`` (``serving`` None) or served there to the
    ``serving`` tenant; None when they may."""
    if serving is not None and (outside := processing_refusal(serving, jurisdiction)):
        return outside
    if jurisdiction not in weights.allowed:
        verb = "served" if serving is not None else "stored"
        return f"{weights.version} may not be {verb} in {jurisdiction} (allowed: {_listed(weights.allowed)})"
    owner = weights.owner
    if owner is not None and owner != serving and jurisdiction not in owner.jurisdictions:
        return (
            f"{weights.version} may not be stored in {jurisdiction}: it belongs to {owner.tenant}, whose "
            f"residency policy is {_listed(owner.jurisdictions)}"
        )
    return None


def processing_refusal(residency: Residency, jurisdiction: str) -> str | None:
    """Why the tenant's data may not be processed in ``jurisdiction`` (by any engine or service of a
    request's, the tenant's own included); None when it may."""
    if jurisdiction in residency.jurisdictions:
        return None
    policy = _listed(residency.jurisdictions)
    return f"{jurisdiction} is outside {residency.tenant}'s residency policy ({policy})"


def _listed(jurisdictions: Iterable[str]) -> str:
    return ", ".join(sorted(jurisdictions)) or "none"


def residency_of(tenant: "Tenant") -> Residency:
    return Residency(tenant.slug, frozenset(tenant.residency))


def weights_of(version: "ModelVersion") -> Weights:
    owner = version.model.owner
    return Weights(
        version=str(version),
        allowed=frozenset(version.allowed_jurisdictions),
        owner=residency_of(owner) if owner is not None else None,
    )
