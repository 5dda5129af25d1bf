"""System checks for settings that ``manage.py check --deploy`` should flag."""

from typing import Any

from django.conf import settings
from django.core import checks

from core.services.audit_checkpoints import CheckpointKeyError, checkpoint_key


@checks.register(checks.Tags.security, deploy=True)
def audit_checkpoint_key(app_configs: Any, **kwargs: Any) -> list[checks.CheckMessage]:
    """Without a checkpoint key, deleting the newest audit events cannot be detected (docs/audit.md)."""
    if not settings.AUDIT_CHECKPOINT_KEY_FILE:
        hint = "Set AUDIT_CHECKPOINT_KEY_FILE to a secret file of 32+ bytes that the database does not hold."
        return [checks.Warning("Audit checkpoints are off.", hint=hint, id="controlplane.W001")]
    try:
        checkpoint_key()
    except CheckpointKeyError as exc:
        return [checks.Error(f"Audit checkpoints cannot be signed: {exc}", id="controlplane.E001")]
    return []
