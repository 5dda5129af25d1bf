"""Statuses, kinds and the lifecycle graph of the model registry."""

from django.db import models


class ModelTask(models.TextChoices):
    CHAT = "chat", "Chat / completion"
    EMBEDDING = "embedding", "Embedding"
    RERANKING = "reranking", "Reranking"
    CLASSIFICATION = "classification", "Classification"


# Models vLLM serves with its pooling runner (embeddings, scores, labels), not generation.
POOLING_TASKS = frozenset({ModelTask.EMBEDDING, ModelTask.RERANKING, ModelTask.CLASSIFICATION})


class PipelineStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    PRODUCTION = "production", "Production"
    DEPRECATED = "deprecated", "Deprecated"
    RETIRED = "retired", "Retired"


P = PipelineStatus
# A pipeline version's lifecycle: its graph is editable in draft only. Promoting one to production
# deprecates the pipeline's previous production version, in the same transaction.
PIPELINE_TRANSITIONS: dict[str, frozenset[str]] = {
    P.DRAFT: frozenset({P.PRODUCTION, P.RETIRED}),
    P.PRODUCTION: frozenset({P.DEPRECATED}),
    P.DEPRECATED: frozenset({P.PRODUCTION, P.RETIRED}),
    P.RETIRED: frozenset(),
}


class Visibility(models.TextChoices):
    CATALOG = "catalog", "Platform catalog (usable by every tenant)"
    PRIVATE = "private", "Private to its owner"


class ArtifactFormat(models.TextChoices):
    SAFETENSORS = "safetensors", "safetensors"
    GGUF = "gguf", "GGUF"
    PYTORCH = "pytorch", "PyTorch bin"


class DataClassification(models.TextChoices):
    PUBLIC = "public", "Public"
    INTERNAL = "internal", "Internal"
    CONFIDENTIAL = "confidential", "Confidential"
    RESTRICTED = "restricted", "Restricted"


class WeightsCheck(models.TextChoices):
    """Whether a version's declared SHA-256s were seen in its source's bytes. Weights are stored once per
    digest for every tenant, so a version's are copied out of the home store only once ingest has read
    them from its own source (or when it was registered with ingest off, the digests taken as declared).
    ``registry.services.versions.weights_check_at_registration`` sets the first state."""

    PENDING = "pending", "Waiting for ingest"
    VERIFIED = "verified", "Verified at ingest"
    REFUSED = "refused", "Refused at ingest"
    DECLARED = "declared", "Taken as declared (ingest off)"


class VersionStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    VALIDATING = "validating", "Validating"
    VALIDATED = "validated", "Validated"
    REJECTED = "rejected", "Rejected"
    STAGED = "staged", "Staged"
    CANARY = "canary", "Canary"
    PRODUCTION = "production", "Production"
    DEPRECATED = "deprecated", "Deprecated"
    RETIRED = "retired", "Retired"


S = VersionStatus
# The lifecycle graph (drawn in ModelVersion's docstring). Rollback is its own action: it moves the
# current production version back to staged and a deprecated one forward to production.
VERSION_TRANSITIONS: dict[str, frozenset[str]] = {
    S.DRAFT: frozenset({S.VALIDATING}),
    S.VALIDATING: frozenset({S.VALIDATED, S.REJECTED}),
    S.VALIDATED: frozenset({S.STAGED, S.DEPRECATED}),
    S.STAGED: frozenset({S.CANARY, S.DEPRECATED}),
    S.CANARY: frozenset({S.PRODUCTION, S.STAGED, S.DEPRECATED, S.REJECTED}),  # rejected: a rollout's policy
    S.PRODUCTION: frozenset({S.DEPRECATED}),
    S.DEPRECATED: frozenset({S.RETIRED}),
    S.RETIRED: frozenset(),
    S.REJECTED: frozenset(),
}
FINAL_STATES = frozenset({S.RETIRED, S.REJECTED})
# States whose versions may be deployed and serve traffic: tenants deploy production and canary versions,
# operators also staged ones (``registry.selectors.deployable_states`` picks the set for a caller).
TENANT_DEPLOYABLE_STATES = frozenset({S.CANARY, S.PRODUCTION})
SERVABLE_STATES = TENANT_DEPLOYABLE_STATES | {S.STAGED}

# Built-in aliases follow the lifecycle: entering the state moves the alias to the version.
STATE_ALIASES: dict[str, str] = {S.STAGED: "staging", S.CANARY: "canary", S.PRODUCTION: "production"}
BUILTIN_ALIASES = frozenset(STATE_ALIASES.values())
# Custom aliases may point at versions in these states.
ALIASABLE_STATES = frozenset({S.VALIDATED, S.STAGED, S.CANARY, S.PRODUCTION, S.DEPRECATED})


class ReportOutcome(models.TextChoices):
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"
