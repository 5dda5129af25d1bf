"""Registering model versions (idempotently) and editing them while they are drafts."""

from functools import partial
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from core.choices import Scope
from core.errors import Conflict, ValidationFailed
from core.principal import Principal
from core.services.audit import audit_record, snapshot
from core.services.validation import full_clean, jurisdiction_codes
from registry.choices import FINAL_STATES, VersionStatus, WeightsCheck
from registry.engine_args import DTYPES, QUANTIZATIONS, validate_engine_args
from registry.hooks import REGISTER_LISTENERS
from registry.models import SHA256, ModelVersion, RegisteredModel
from registry.services.access import require_on_model
from registry.sources import check_source

# What the weights are: fixed at registration (CONTENT_FIELDS are fixed when the version leaves draft).
WEIGHTS_FIELDS = (
    "artifact_uri",
    "artifact_sha256",
    "artifact_size_bytes",
    "artifact_format",
    "artifact_manifest",
)
CONTENT_FIELDS = (
    "artifact_uri",
    "artifact_sha256",
    "artifact_size_bytes",
    "artifact_format",
    "artifact_manifest",
    "served_model_name",
    "runtime_version",
    "runtime_image",
    "tokenizer_ref",
    "tokenizer_sha256",
    "prompt_template_version",
    "chat_template",
    "engine_args",
    "max_context_length",
    "parameter_count",
    "dtype",
    "quantization",
    "architecture",
    "sizing_concurrency",
    "ci_pipeline_url",
    "source_commit",
)
GOVERNANCE_FIELDS = ("data_classification", "allowed_jurisdictions", "compliance_tags", "owner_contact")
VERSION_FIELDS = ("version", "status", *CONTENT_FIELDS, *GOVERNANCE_FIELDS)
ARCHITECTURE_KEYS = {
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_size",
}


def _check_manifest(manifest: Any) -> list[dict[str, Any]]:
    if not isinstance(manifest, list):
        raise ValidationFailed("artifact_manifest must be a list of files.")
    seen = set()
    for index, entry in enumerate(manifest):
        where = f"artifact_manifest[{index}]"
        path = entry.get("path") if isinstance(entry, dict) else None
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            raise ValidationFailed(f"{where}.path must be a relative path inside the model directory.")
        if path in seen:
            raise ValidationFailed(f"{where}.path '{path}' is listed twice.")
        seen.add(path)
        if set(entry) - {"path", "sha256", "size_bytes"}:
            raise ValidationFailed(f"{where} may only have path, sha256 and size_bytes.")
        if "sha256" in entry:
            try:
                SHA256(entry["sha256"])
            except Exception as exc:
                raise ValidationFailed(f"{where}.sha256 is not a SHA-256 digest.") from exc
        size = entry.get("size_bytes", 0)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValidationFailed(f"{where}.size_bytes must be a non-negative integer.")
    return manifest


def _check_architecture(architecture: Any) -> None:
    if not isinstance(architecture, dict) or set(architecture) - ARCHITECTURE_KEYS:
        raise ValidationFailed(f"architecture may only have {', '.join(sorted(ARCHITECTURE_KEYS))}.")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in architecture.values()):
        raise ValidationFailed("architecture values must be positive integers.")


def _check_version(version: ModelVersion, *, new_source: bool = True) -> None:
    """``new_source``: the artifact URI is being set, so it must be an allowed source now (a version
    registered earlier keeps its own, checked again whenever it is read)."""
    version.artifact_sha256 = version.artifact_sha256.lower()
    version.tokenizer_sha256 = version.tokenizer_sha256.lower()
    full_clean(version, exclude=["model", "parent"])
    if new_source:
        check_source(version.artifact_uri)
    _check_manifest(version.artifact_manifest)
    _check_architecture(version.architecture)
    if version.dtype not in DTYPES:
        raise ValidationFailed(
            f"dtype must be one of {', '.join(DTYPES)}.", detail={"dtype": [version.dtype]}
        )
    if version.quantization and version.quantization not in QUANTIZATIONS:
        raise ValidationFailed(
            f"Unknown quantization '{version.quantization}'.", detail={"quantization": ["?"]}
        )
    version.engine_args = validate_engine_args(version.engine_args)
    if version.engine_args.get("max_model_len", 0) > version.max_context_length:
        raise ValidationFailed("engine_args.max_model_len is larger than the version's max_context_length.")
    version.allowed_jurisdictions = jurisdiction_codes(
        version.allowed_jurisdictions, field="allowed_jurisdictions", allow_empty=True
    )
    tags = version.compliance_tags
    if not isinstance(tags, list) or not all(isinstance(t, str) and 0 < len(t) <= 50 for t in tags):
        raise ValidationFailed("compliance_tags must be a list of short strings.")


def _existing(model: RegisteredModel, version: str, sha256: str) -> ModelVersion | None:
    """The same release registered before (idempotent retry), or a conflict if the bytes differ."""
    found = model.versions.filter(version=version).first()
    if found is None:
        return None
    if found.artifact_sha256 != sha256.lower():
        raise Conflict(
            f"{model.ref}@{version} is already registered with another artifact "
            f"(sha256 {found.artifact_sha256[:12]}…); register a new version instead.",
            code="version_exists",
            detail={"artifact_sha256": found.artifact_sha256},
        )
    return found


def _announce_registered(version: ModelVersion) -> None:
    """Listeners (the artifacts app streams the weights into the home store) hear of it on commit."""
    for listener in REGISTER_LISTENERS:
        transaction.on_commit(partial(listener, version))


def version_register(
    *,
    actor: Principal,
    model: RegisteredModel,
    version: str,
    parent_version: str | None = None,
    **fields: Any,
) -> tuple[ModelVersion, bool]:
    """Register a release; the same model + version + sha256 returns the existing one (created=False)."""
    require_on_model(actor, model, Scope.REGISTRY_WRITE)
    unknown = set(fields) - set(CONTENT_FIELDS) - set(GOVERNANCE_FIELDS)
    if unknown:
        raise ValidationFailed(f"Unknown version field(s): {', '.join(sorted(unknown))}.")
    existing = _existing(model, version, str(fields.get("artifact_sha256", "")))
    if existing is not None:
        return existing, False
    candidate = ModelVersion(model=model, version=version, created_by_name=actor.name, **fields)
    candidate.weights_check = weights_check_at_registration()
    if parent_version:
        candidate.parent = model.versions.filter(version=parent_version).first()
        if candidate.parent is None:
            raise ValidationFailed(f"parent_version '{parent_version}' does not exist in {model.ref}.")
    _check_version(candidate)
    try:
        with transaction.atomic():
            candidate.save()
            _announce_registered(candidate)
            audit_record(
                actor=actor,
                action="model_version.registered",
                target=candidate,
                tenant=model.owner,
                after=snapshot(candidate, VERSION_FIELDS),
            )
    except IntegrityError:
        # A concurrent registration of the same version won the race.
        existing = _existing(model, version, candidate.artifact_sha256)
        if existing is None:
            raise
        return existing, False
    return candidate, True


def weights_check_at_registration() -> str:
    """The one answer to "will ingest read this version's weights?": pending when it will (the artifacts
    app ingests exactly the versions registered pending), taken as declared when it is off."""
    return WeightsCheck.PENDING if settings.ARTIFACT_INGEST_ON_REGISTER else WeightsCheck.DECLARED


def version_update(*, actor: Principal, version: ModelVersion, changes: dict[str, Any]) -> ModelVersion:
    """Release content changes only in draft; governance metadata until the version is final."""
    require_on_model(actor, version.model, Scope.REGISTRY_WRITE)
    unknown = set(changes) - set(CONTENT_FIELDS) - set(GOVERNANCE_FIELDS)
    if unknown:
        raise ValidationFailed(f"Field(s) that cannot be changed: {', '.join(sorted(unknown))}.")
    with transaction.atomic():
        current = (
            ModelVersion.objects.select_for_update(of=("self",))
            .select_related("model__owner")
            .get(pk=version.pk)
        )
        weights = sorted(set(changes) & set(WEIGHTS_FIELDS))
        if weights:
            # Ingest checks the weights against their source and replication copies them by digest: both
            # would be undone by a change after registration.
            raise Conflict(
                f"{current}'s weights ({', '.join(weights)}) are fixed when it is registered. "
                "Register a new version.",
                code="immutable",
            )
        content = sorted(set(changes) & set(CONTENT_FIELDS))
        if content and current.status != VersionStatus.DRAFT:
            raise Conflict(
                f"{current} is {current.status}: its release content ({', '.join(content)}) is immutable "
                "once it leaves draft. Register a new version.",
                code="immutable",
            )
        if current.status in FINAL_STATES:
            raise Conflict(f"{current} is {current.status} and can no longer change.", code="immutable")
        before = snapshot(current, changes.keys())
        for name, value in changes.items():
            setattr(current, name, value)
        _check_version(current, new_source=False)
        current.updated_at = timezone.now()
        current.save(update_fields=[*changes.keys(), "updated_at"])
        audit_record(
            actor=actor,
            action="model_version.updated",
            target=current,
            tenant=current.model.owner,
            before=before,
            after=snapshot(current, changes.keys()),
        )
    return current
