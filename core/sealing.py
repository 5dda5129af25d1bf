"""Sealing tenants' secrets for storage: AES-256-GCM under a key derived from ``TENANT_SECRETS_KEY``.

A sealed value is bound to what it belongs to (``context``, e.g. the tenant and the secret's name), so a
sealed blob copied to another row does not open there. The stored form is the 12-byte nonce followed by
the ciphertext and its tag; nothing of the value is stored in the clear, not even a hash of it (a short
secret's hash could be guessed offline).
"""

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from django.conf import settings
from django.utils.crypto import salted_hmac

NONCE_BYTES = 12


class Unreadable(Exception):
    """The sealed value does not open: another key (``TENANT_SECRETS_KEY`` changed) or another context."""


def _cipher() -> AESGCM:
    key = salted_hmac(
        "core.sealing", "tenant-secrets", secret=settings.TENANT_SECRETS_KEY, algorithm="sha256"
    )
    return AESGCM(key.digest())


def sealing_key_tag() -> str:
    """Names the sealing key (its generation) without giving it away: 8 hex characters of an HMAC."""
    tag = salted_hmac("core.sealing", "key-tag", secret=settings.TENANT_SECRETS_KEY, algorithm="sha256")
    return tag.hexdigest()[:8]


def seal(value: str, context: str) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + _cipher().encrypt(nonce, value.encode(), context.encode())


def unseal(sealed: bytes, context: str) -> str:
    try:
        return _cipher().decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], context.encode()).decode()
    except (InvalidTag, ValueError) as exc:
        raise Unreadable(context) from exc
