"""Signed checkpoints of the audit chain, kept outside the database (docs/audit.md).

The chain itself only proves that events were not changed *between* its first and last row: whoever
owns the table can delete the newest rows and rewind the head row, and the shorter chain is still
consistent. A checkpoint is a line ``{"seq", "hash", "at", "sig"}`` appended to a file in
``AUDIT_CHECKPOINT_DIR``, signed with HMAC-SHA256 under a key read from ``AUDIT_CHECKPOINT_KEY_FILE``:
neither the key nor the file is in the database, so a database owner can neither forge a newer
checkpoint nor make the chain agree with an old one after rewinding it.
"""

import hashlib
import hmac
import json
import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

from core.models import AuditEvent

LOG_NAME = "checkpoints.jsonl"
# Domain separation: a signature made with this key for anything else never passes as a checkpoint.
_CONTEXT = b"controlplane-audit-checkpoint-v1\n"
_MIN_KEY_BYTES = 32


class CheckpointKeyError(Exception):
    """The configured key file cannot be used; verification reports it instead of passing."""


@dataclass(frozen=True)
class Checkpoint:
    seq: int
    hash: str
    at: datetime

    def signed_bytes(self) -> bytes:
        body = {"seq": self.seq, "hash": self.hash, "at": self.at.astimezone(UTC).isoformat()}
        return _CONTEXT + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    def as_dict(self) -> dict[str, object]:
        return {"seq": self.seq, "hash": self.hash, "at": self.at.astimezone(UTC).isoformat()}


@dataclass(frozen=True)
class CheckpointLog:
    """Every checkpoint that carries a valid signature, and what was wrong with the other lines."""

    enabled: bool
    checkpoints: tuple[Checkpoint, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def latest(self) -> Checkpoint | None:
        return max(self.checkpoints, key=lambda cp: cp.seq, default=None)


def _log_path() -> Path:
    return Path(settings.AUDIT_CHECKPOINT_DIR) / LOG_NAME


def checkpoint_key() -> bytes | None:
    """The signing key, or None when checkpoints are off (no key file configured).

    Locally (``AUDIT_CHECKPOINT_KEY_GENERATE``) a missing key file is created once with mode 0600; a
    configured file that is missing elsewhere is an error, never silently replaced by a new key.
    """
    if not settings.AUDIT_CHECKPOINT_KEY_FILE:
        return None
    path = Path(settings.AUDIT_CHECKPOINT_KEY_FILE)
    if not path.exists() and settings.AUDIT_CHECKPOINT_KEY_GENERATE:
        _generate_key(path)
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise CheckpointKeyError(f"the checkpoint key file {path} cannot be read: {exc}") from exc
    if len(key) < _MIN_KEY_BYTES:
        raise CheckpointKeyError(f"the checkpoint key in {path} is shorter than {_MIN_KEY_BYTES} bytes")
    return key


def _generate_key(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process generated it first
        return
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(32))


def _signature(key: bytes, checkpoint: Checkpoint) -> str:
    return hmac.new(key, checkpoint.signed_bytes(), hashlib.sha256).hexdigest()


def _parse(key: bytes, line: str) -> Checkpoint | None:
    """The checkpoint on one line if its signature holds; None if it is forged, altered or unreadable."""
    try:
        raw = json.loads(line)
        checkpoint = Checkpoint(
            seq=int(raw["seq"]), hash=str(raw["hash"]), at=datetime.fromisoformat(raw["at"])
        )
        signature = str(raw["sig"])
    except (ValueError, TypeError, KeyError):
        return None
    expected = _signature(key, checkpoint).encode()
    return checkpoint if hmac.compare_digest(signature.encode(), expected) else None


def checkpoints_read() -> CheckpointLog:
    """All checkpoints in the log; a line whose signature does not hold is a problem, not skipped."""
    try:
        key = checkpoint_key()
    except CheckpointKeyError as exc:
        return CheckpointLog(enabled=True, problems=(str(exc),))
    if key is None:
        return CheckpointLog(enabled=False)
    path = _log_path()
    if not path.exists():
        return CheckpointLog(enabled=True)
    checkpoints, problems = [], []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        checkpoint = _parse(key, line) if line.strip() else None
        if checkpoint is not None:
            checkpoints.append(checkpoint)
        elif line.strip():
            problems.append(f"{path} line {number} is not a validly signed checkpoint: forged or altered")
    return CheckpointLog(enabled=True, checkpoints=tuple(checkpoints), problems=tuple(problems))


def checkpoint_append(*, seq: int, hash: str, at: datetime) -> Checkpoint | None:
    """Sign (seq, hash, at) and append it to the log; None when checkpoints are off."""
    key = checkpoint_key()
    if key is None:
        return None
    checkpoint = Checkpoint(seq=seq, hash=hash, at=at)
    line = json.dumps({**checkpoint.as_dict(), "sig": _signature(key, checkpoint)}) + "\n"
    path = _log_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_APPEND: one write per line, never a rewrite of what is there.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return checkpoint


def checkpoint_head(*, now: datetime) -> Checkpoint | None:
    """Checkpoint the newest committed event (the periodic task); nothing when it is already anchored."""
    newest = AuditEvent.objects.order_by("-seq").values("seq", "hash").first()
    if newest is None:
        return None
    log = checkpoints_read()
    anchored = log.latest is not None and (log.latest.seq, log.latest.hash) == (newest["seq"], newest["hash"])
    if not log.enabled or anchored:
        return None
    return checkpoint_append(seq=newest["seq"], hash=newest["hash"], at=now)
