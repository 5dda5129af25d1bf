"""The API docs group operations by capability (one tag each), decided here in one place by path."""

import fnmatch
from typing import Any

API_PREFIX = "/api/v1/"

# (tag, description, path prefixes under /api/v1/), in the order the docs show them; a ``*`` in a prefix
# stands for one path segment, and the longest matching prefix wins.
CAPABILITIES: list[tuple[str, str, tuple[str, ...]]] = [
    (
        "tenants & access",
        "Tenants and their members, users, service accounts, API tokens, who am I.",
        ("tenants/", "invitations/", "users/", "me/", "service-accounts/", "tokens/"),
    ),
    (
        "registry",
        "Models, versions and their lifecycle, aliases, validation reports, engine arguments.",
        ("models/", "engine-arguments/"),
    ),
    (
        "pipelines",
        "Pipelines (graphs of stages served as one model name), their versions and lifecycle, and the "
        "tenants' retrieval indexes their retrieve stages search.",
        ("pipelines/", "indexes/"),
    ),
    (
        "regions & deployments",
        "Regions, GPU pools, placement and deployments, their autoscaling and its decisions.",
        ("regions/", "deployments/", "scaling-decisions/"),
    ),
    (
        "artifacts",
        "Model weights in regional stores: replicas, storage, the residency matrix.",
        ("artifacts/",),
    ),
    ("routing", "The route table, health, failover events, what-if, gateway configuration.", ("routing/",)),
    (
        "rollouts",
        "Canary, blue-green and shadow rollouts in region waves: start, pause, resume, abort, promote.",
        ("rollouts/",),
    ),
    (
        "autoscaling",
        "Autoscaling policies per deployment, their scaling state, and the decision log.",
        ("deployments/*/*/autoscaling/", "scaling-decisions/"),
    ),
    (
        "usage & costs",
        "Usage records from gateways, GPU prices, cost reports, idle GPUs, budgets.",
        ("usage/", "costs/", "prices/", "budgets/"),
    ),
    ("audit", "The audit log: events, export, chain verification.", ("audit-events/",)),
    ("operations", "Long-running actions started by other calls (202 + Location).", ("operations/",)),
]
UNCLASSIFIED = "unclassified"  # a path no capability claims; a test keeps this tag unused

TAGS = [{"name": name, "description": description} for name, description, _ in CAPABILITIES]


def capability_of(path: str) -> str:
    rest = path.removeprefix(API_PREFIX)
    matches = [
        (len(prefix), name)
        for name, _, prefixes in CAPABILITIES
        for prefix in prefixes
        if fnmatch.fnmatchcase(rest, prefix + "*") and rest.count("/") >= prefix.count("/")
    ]
    return max(matches)[1] if matches else UNCLASSIFIED


def tag_by_capability(result: dict[str, Any], **_: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: replace the default per-path tag by the capability."""
    for path, item in result.get("paths", {}).items():
        for operation in item.values():
            if isinstance(operation, dict) and "operationId" in operation:
                operation["tags"] = [capability_of(path)]
    return result
